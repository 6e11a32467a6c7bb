#!/usr/bin/env bash
# RN18 eager re-check with the NVJPG engine's utilization logged (is the hardware decoder in use?)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DATA=/tmp/bd; S=$SECONDS; mkdir -p $OUT
python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"; git log --oneline -1 2>/dev/null
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
nvidia-smi dmon -s u -d 1 > $OUT/dmon.txt 2>&1 & DM=$!
timeout 240 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off --loaders dali \
  --steps 100 --warmup 30 --repeats 3 --out /tmp/br3 -- $C 2>&1 | grep -E "img/s|windows|^\|" | grep -v arning
kill $DM; cp /tmp/br3/results.json $OUT/bench_rn18.json
head -3 $OUT/dmon.txt; awk 'NR>2 {print}' $OUT/dmon.txt | awk '{print $2, $6, $7}' | sort | uniq -c | sort -rn | head -12
echo "all: $((SECONDS-S)) s"
