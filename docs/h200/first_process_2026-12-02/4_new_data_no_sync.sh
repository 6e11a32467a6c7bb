#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DATA=/tmp/bd3; S=$SECONDS; mkdir -p $OUT
python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"; grep -E "^(Dirty|Writeback):" /proc/meminfo
sleep 0; grep -E "^(Dirty|Writeback):" /proc/meminfo
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
timeout 200 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off --loaders dali \
  --steps 100 --warmup 30 --repeats 3 --out /tmp/br6 -- $C 2>&1 | grep -E "^\| (model|e2e)"
cp /tmp/br6/results.json $OUT/bench6.json; echo "all: $((SECONDS-S)) s"
