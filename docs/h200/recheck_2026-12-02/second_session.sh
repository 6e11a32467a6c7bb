#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
DATA=/tmp/bd2; S=$SECONDS; export BASEPP=$PYTHONPATH
PYTHONPATH=$PWD:$BASEPP python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 100 --val-per-class 5 --links 16 --workers $(nproc)  2>&1 | tail -1
echo "data: $((SECONDS-S)) s"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
b() { (cd $1 && PYTHONPATH=$PWD:$BASEPP timeout 60 python scripts/benchmark.py --modes e2e --models resnet18 --compile off --loaders dali \
  --steps 100 --warmup 30 --repeats 3 --out /tmp/b_$2 -- $C 2>&1 | grep -E "^\| e2e"); echo "$2 done $((SECONDS-S)) s"; }
b $PWD now
b $PWD/.gpu/old old_5d4084c
sed -i 's/kwargs = {"adjust_orientation": False}/kwargs = {}/' dali_train/data/dali_graph.py && grep -n "kwargs = {}" dali_train/data/dali_graph.py
b $PWD now_no_adjust_orientation_arg
