#!/usr/bin/env bash
# loader.copy_stream: DALI's batches copied out on a CUDA stream of their own (the training stream waits for
# it) instead of on the training stream, behind its queued steps. The default and the variant in strict
# alternation, e2e rows in the same processes after an untimed warm-up row: two eager ResNet-18 processes,
# one compiled (reduce-overhead). OUT: one JSON per process (e1, e2, c1), log.txt. 2026-12-03, 1xH200.
# The option is not kept: run on 6681953 with exp.patch applied (git apply docs/h200/copy_stream_2026-12-03/exp.patch).
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 \
  --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
VARIANTS="--variant warm=dali:loader.copy_stream=false --variant d2=dali:loader.copy_stream=false
  --variant d3=dali:loader.copy_stream=false --variant s1=dali:loader.copy_stream=true
  --variant s2=dali:loader.copy_stream=true --variant s3=dali:loader.copy_stream=true"
run() {  # NAME COMPILE LOADERS
  timeout 280 python scripts/benchmark.py --modes model e2e --models resnet18 --compile "$2" $VARIANTS \
    --loaders $3 --steps 100 --warmup 30 --repeats 3 --out /tmp/cs/$1 -- $COMMON 2>&1 \
    | grep --line-buffered -E "^(model|e2e) |rror" | while read -r l; do echo "$(date +%T) $1: $l"; done
  cp /tmp/cs/$1/results.json "$OUT/$1.json" 2>/dev/null
}
{
  run e1 off "warm dali s1 d2 s2 d3 s3"
  run e2 off "warm s1 dali s2 d2 s3 d3"
  run c1 reduce-overhead "warm dali s1 d2 s2"
} | tee "$OUT/log.txt"
