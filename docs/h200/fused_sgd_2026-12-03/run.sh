#!/usr/bin/env bash
# Does a fused SGD step (one kernel per parameter group instead of foreach's few per tensor list) raise
# ResNet-18 eager e2e ÷ model-only? Alternating processes A (foreach, torch's CUDA default) and B (fused),
# each model-only then e2e dali, as scripts/gpu_benchmark.sh times them. From the repo root after
# `source .gpu/p3/unpack.sh`; OUT: one JSON per process. 2026-12-03, 1xH200.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 \
  --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
# SGD with heavy-ball momentum as optimizer=sgd builds it, through the generic timm schema so kwargs reach torch
SGD="optimizer=adamw optimizer.name=momentum optimizer.lr=0.1 optimizer.weight_decay=1e-4 +optimizer.kwargs.momentum=0.9"
run() {  # NAME EXTRA-OVERRIDES...
  local name=$1; shift
  timeout 150 python scripts/benchmark.py --modes model e2e --loaders dali --models resnet18 --compile off \
    --steps 100 --warmup 30 --repeats 3 --out /tmp/fused/$name -- $COMMON $SGD "$@" 2>&1 \
    | grep -E "^(model|e2e) |rror|optimizer:" | sed "s/^/$name: /"
  cp /tmp/fused/$name/results.json "$OUT/$name.json" 2>/dev/null
}
python scripts/benchmark.py --modes e2e --loaders dali --models resnet18 --compile off --steps 30 --warmup 10 \
  --repeats 1 --out /tmp/fused/warmup -- $COMMON 2>&1 | grep -E "^e2e" | sed "s/^/warm-up: /"
for i in 1 2 3; do
  run A$i +optimizer.kwargs.foreach=true
  run B$i +optimizer.kwargs.fused=true
done
