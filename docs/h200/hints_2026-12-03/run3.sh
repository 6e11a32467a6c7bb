#!/usr/bin/env bash
# The shipped default (hints on the train pipeline only), checked in a fresh machine session: ResNet-18
# eager model-only and e2e, then train.py 2 epochs of the long set, as scripts/gpu_benchmark.sh runs them.
# OUT: r3.json, train.metrics.jsonl, log.txt. 2026-12-03, 1xH200.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 \
  --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
{
  python scripts/benchmark.py --modes model e2e --loaders dali --models resnet18 --compile off --steps 100 --warmup 30 \
    --repeats 3 --out /tmp/r3 -- $COMMON 2>&1 | grep -E "^(model|e2e) |rror"
  cp /tmp/r3/results.json "$OUT/r3.json"
  python train.py $COMMON model=resnet18 trainer.epochs=2 trainer.log_every_n_steps=125 hydra.run.dir=/tmp/r3train 2>&1 \
    | grep -E "epoch [0-9]+:|rror"
  cp /tmp/r3train/metrics.jsonl "$OUT/train.metrics.jsonl"
} | tee "$OUT/log.txt"
