#!/usr/bin/env bash
# DALI's hardware-decoder buffer hints (loader.preallocate_{width,height}_hint, which NVIDIA's ResNet-50
# example sets) beside the default (no hint; dali_again is the default again, hw_decoder_load=1.0 being the default), ResNet-18 eager e2e, alternating rows in two processes. From
# the repo root after `source .gpu/p3/unpack.sh`, data made by docs/h200/fused_sgd_2026-12-03/run.sh.
# OUT: one JSON per process (p1, p2). 2026-12-03, 1xH200. Then run2.sh.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
VARIANTS="--variant dali_again=dali:loader.hw_decoder_load=1.0 --variant hint=dali:loader.preallocate_width_hint=640,loader.preallocate_height_hint=480
  --variant hint_imagenet=dali:loader.preallocate_width_hint=5980,loader.preallocate_height_hint=6430"
for i in 1 2; do
  timeout 200 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off $VARIANTS \
    --loaders dali hint hint_imagenet dali_again --steps 100 --warmup 30 --repeats 3 --out /tmp/hints/p$i -- $COMMON 2>&1 \
    | grep -E "^(model|e2e) |rror" | sed "s/^/p$i: /"
  cp /tmp/hints/p$i/results.json "$OUT/p$i.json" 2>/dev/null
done
