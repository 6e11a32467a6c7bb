#!/usr/bin/env bash
# Re-measure of the 1gpu eager rows and train.py with the app as it is now (methodology of docs/benchmarks.md)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DATA=/tmp/bd
S=$SECONDS
python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -2
echo "data: $((SECONDS-S)) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import sys, torch, timm, nvidia.dali as d; print('python', sys.version.split()[0], 'torch', torch.__version__, 'timm', timm.__version__, 'dali', d.__version__)"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
mkdir -p $OUT
timeout 200 python scripts/benchmark.py --modes model e2e --models resnet18 resnet50 --compile off --loaders dali \
  --steps 100 --warmup 30 --repeats 3 --out /tmp/br -- $C 2>&1 | grep -E "img/s|windows|^\|" | grep -v arning
cp /tmp/br/results.json $OUT/bench_eager.json
echo "bench done: $((SECONDS-S)) s"
timeout 150 python train.py $C model=resnet18 trainer.epochs=2 trainer.log_every_n_steps=125 hydra.run.dir=/tmp/bt 2>&1 | grep -E "epoch [0-9]+:|rror" | tail -4
cp /tmp/bt/metrics.jsonl $OUT/train.metrics.jsonl
echo "all: $((SECONDS-S)) s"
