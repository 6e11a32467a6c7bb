#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DATA=/tmp/bd; S=$SECONDS; mkdir -p $OUT
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
nvidia-smi -q -d CLOCK,PERFORMANCE | grep -E "Graphics|SM |Memory|Throttle|Slowdown|Active" | head -20
nvidia-smi dmon -s pucv -d 1 > $OUT/dmon4.txt 2>&1 & DM=$!
timeout 300 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off --loaders dali \
  --steps 100 --warmup 30 --repeats 3 --out /tmp/br4 -- $C 2>&1 | grep -E "img/s|windows|^\|" | grep -v arning
kill $DM; cp /tmp/br4/results.json $OUT/bench4.json; head -2 $OUT/dmon4.txt; awk 'NR%10==3' $OUT/dmon4.txt | head -30
echo "all: $((SECONDS-S)) s"
