#!/usr/bin/env bash
# loader.hw_decoder_load below 1 (the share of JPEGs on the hardware decoder; the rest go to the batched CUDA
# decoder instead of the hardware one's per-image region decode and event syncs): ResNet-18 eager and compiled,
# each variant twice in one process beside the default; then the pipeline-lifetime check after the shutdown
# change. From the repo root after `source .gpu/p3/unpack.sh`, with OUT set. 2026-12-02, app at a2fdc73.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
S=$SECONDS; mkdir -p $OUT
DATA=/tmp/gpu-benchmark-data-x8  # what scripts/gpu_benchmark.sh 1gpu makes and reuses
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
W="--steps 100 --warmup 30 --repeats 3"
V="--variant hw09=dali:loader.hw_decoder_load=0.9 --variant hw08=dali:loader.hw_decoder_load=0.8
   --variant hw07=dali:loader.hw_decoder_load=0.7 --variant dali2=dali:loader.hw_decoder_load=1.0
   --variant hw09b=dali:loader.hw_decoder_load=0.9 --variant hw08b=dali:loader.hw_decoder_load=0.8"
one() {  # label timeout compile modes loaders
  timeout $2 python scripts/benchmark.py --modes $4 --models resnet18 --compile $3 --loaders $5 $V $W --out /tmp/b_$1 -- $C > /tmp/b_$1.log 2>&1
  grep -E "^(model|e2e) " /tmp/b_$1.log | cut -c1-300 | head -12 | sed "s/^/$1 /"
  cp /tmp/b_$1/results.json $OUT/$1.json 2>/dev/null; cp /tmp/b_$1.log $OUT/$1.log
  echo "  ($((SECONDS-S)) s)"
}
one warm 100 off e2e "dali"
one E 170 off "model e2e" "dali hw09 hw08 hw07 dali2 hw09b hw08b"
one R 200 reduce-overhead "model e2e" "dali hw09 hw08 dali2 hw09b hw08b"
D=/tmp/lifetime-data
[ -d $D/val ] || python scripts/make_synthetic_imagenet.py --out $D --classes 100 --train-per-class 20 --val-per-class 2 --workers $(nproc) 2>&1 | tail -1
timeout 60 python docs/h200/pipeline_lifetime_2026-12-02/check.py $D cuda:0 2>&1 | grep -vE "nvjpeg2k|nvtiff|nvImageCodec|^\s*$" | tee $OUT/lifetime.txt
echo "all: $((SECONDS-S)) s"
