#!/usr/bin/env bash
# Is the e2e cost DALI's work per batch? Rows TWICE=t1,t2 train on every DALI batch twice (two identical
# training steps per batch: the model's work per step unchanged, DALI's halved), beside rows of the default,
# alternating in one eager ResNet-18 process after an untimed row. If DALI's per-batch GPU work is what
# e2e loses, the twice rows recover about half of it. OUT: twice.json, log.txt (run twice here: twice1/log1, twice2/log2). 2026-12-03, 1xH200, on
# d51f76d with exp.patch applied (git apply docs/h200/twice_2026-12-03/exp.patch).
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 \
  --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
V="--variant warm=dali:loader.num_threads=8 --variant d2=dali:loader.num_threads=8 --variant t1=dali:loader.num_threads=8
  --variant t2=dali:loader.num_threads=8"
TWICE=t1,t2 timeout 280 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off $V \
  --loaders warm dali t1 d2 t2 --steps 100 --warmup 30 --repeats 3 --out /tmp/twice -- $COMMON 2>&1 \
  | grep --line-buffered -E "^(model|e2e) |rror" | while read -r l; do echo "$(date +%T) $l"; done | tee "$OUT/log.txt"
cp /tmp/twice/results.json "$OUT/twice.json"
