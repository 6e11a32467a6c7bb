#!/usr/bin/env bash
# Does taking batches from DALI on a thread (loader.fetch_thread) close ResNet-18 eager's gap?
# Needs fetch_thread.patch applied (git apply docs/h200/fetch_thread_2026-12-02/fetch_thread.patch: the option was
# not kept). From the repo root after `source .gpu/p3/unpack.sh`, with OUT set. 2026-12-02 13:47 UTC, app at c46ea54.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
S=$SECONDS; mkdir -p $OUT
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA|Model name"; nvidia-smi topo -m | head -3
DATA=/tmp/bd8
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
W="--steps 100 --warmup 30 --repeats 3"
V="--variant thread=dali:loader.fetch_thread=true --variant thread2=dali:loader.fetch_thread=true --variant dali2=dali:loader.fetch_thread=false"
one() {  # label compile modes loaders
  timeout 200 python scripts/benchmark.py --modes $3 --models resnet18 --compile $2 --loaders $4 $V $W --out /tmp/b_$1 -- $C 2>&1 \
    | grep -E "^(model|e2e) " | sed "s/^/$1 /"
  cp /tmp/b_$1/results.json $OUT/$1.json 2>/dev/null
  echo "  ($((SECONDS-S)) s)"
}
one warm off e2e "dali"
one A off "model e2e" "dali thread dali2 thread2"
one B off "model e2e" "thread dali thread2 dali2"
one R reduce-overhead "model e2e" "dali thread"
echo "all: $((SECONDS-S)) s"
