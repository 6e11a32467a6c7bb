#!/usr/bin/env bash
# Does an earlier torch.profiler window slow the rows timed after it in one process (CUPTI stays attached)?
# From the repo root after `source .gpu/p3/unpack.sh`, with OUT set. 2026-12-02 14:15 UTC, app at 3297aff (before
# 45d63fd, which moved --profile after every timed row). The device time ran out during plain2: no result.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
S=$SECONDS; mkdir -p $OUT
DATA=/tmp/bd32
python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 50 --val-per-class 2 --links 32 --workers $(nproc) 2>&1 | tail -2
echo "data: $((SECONDS-S)) s"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
W="--steps 100 --warmup 30 --repeats 3"
one() {  # label extra
  timeout 100 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off --loaders dali $W $2 --out /tmp/b3_$1 -- $C 2>&1 \
    | grep -E "^(model|e2e) " | sed "s/^/$1 /"
  cp /tmp/b3_$1/results.json $OUT/$1.json 2>/dev/null
  echo "  ($((SECONDS-S)) s)"
}
one plain1 ""
one profiled "--profile /tmp/b3_prof"
one plain2 ""
