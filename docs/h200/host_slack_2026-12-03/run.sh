#!/usr/bin/env bash
# Is eager ResNet-18 e2e bound by the training thread's host time? Each process adds SPIN_US microseconds of
# Python busy-looping (holding the GIL) before every training step, model-only and e2e alike: if a row's
# step time grows by the spin, the host was the bottleneck; if not, it had that much slack. Processes in the
# order 0, 1000, 400, 0 us; each: model only, then two e2e rows. OUT: one JSON per process, log.txt.
# 2026-12-03, 1xH200, on 6681953 with exp.patch applied (git apply docs/h200/host_slack_2026-12-03/exp.patch).
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 \
  --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
{
  i=0
  for spin in 0 1000 400 0; do
    i=$((i + 1))
    SPIN_US=$spin timeout 200 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off \
      --variant again=dali:loader.num_threads=8 --loaders dali again --steps 100 --warmup 30 --repeats 3 \
      --out /tmp/spin/p$i -- $COMMON 2>&1 | grep --line-buffered -E "^(model|e2e) |rror" \
      | while read -r l; do echo "$(date +%T) p$i spin ${spin}us: $l"; done
    cp /tmp/spin/p$i/results.json "$OUT/p${i}_spin$spin.json" 2>/dev/null
  done
} | tee "$OUT/log.txt"
