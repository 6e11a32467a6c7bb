#!/usr/bin/env bash
# ResNet-18 eager's last 1.4 ms per step: (rrc) decode whole images (the hardware decoder's batched path) and crop
# with fn.random_resized_crop on the GPU, instead of the fused region decode whose profile shows per-image copies,
# rgba2rgb kernels and event syncs; (pin) the training thread alone on core 0, autograd's on core 1, DALI's and
# the rest on the others. exp.patch (options not kept unless they win). From the repo root after
# `source .gpu/p3/unpack.sh`, with OUT set. App at d452771 + exp.patch.
set -uo pipefail
export PYTHONUNBUFFERED=1
S=$SECONDS; mkdir -p $OUT
HERE=$(cd "$(dirname "$0")" && pwd)
# A copy of the tree with exp.patch applied (the run of 2026-12-02 copied the patched files over instead: the same)
rm -rf /tmp/exptree && mkdir -p /tmp/exptree && tar -c --exclude=./.gpu . | tar -x -C /tmp/exptree
cd /tmp/exptree && patch -p1 < "$HERE/exp.patch" && export PYTHONPATH=$PWD:${PYTHONPATH:-}
grep -c rrc_full dali_train/config.py
DATA=/tmp/gpu-benchmark-data-x8  # what scripts/gpu_benchmark.sh 1gpu makes and reuses
[ -d $DATA/val ] || python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
W="--steps 100 --warmup 30 --repeats 3"
V="--variant rrc=dali:data.train_transform=rrc_full --variant pin=dali:loader.pin_threads=true
   --variant both=dali:data.train_transform=rrc_full,loader.pin_threads=true
   --variant dali2=dali:loader.pin_threads=false --variant rrc2=dali:data.train_transform=rrc_full
   --variant pin2=dali:loader.pin_threads=true --variant both2=dali:data.train_transform=rrc_full,loader.pin_threads=true"
one() {  # label timeout compile modes loaders
  timeout $2 python scripts/benchmark.py --modes $4 --models resnet18 --compile $3 --loaders $5 $V $W --out /tmp/b_$1 -- $C > /tmp/b_$1.log 2>&1
  grep -E "^(model|e2e) |pin_threads=True" /tmp/b_$1.log | cut -c1-600 | head -12 | sed "s/^/$1 /"
  cp /tmp/b_$1/results.json $OUT/$1.json 2>/dev/null; cp /tmp/b_$1.log $OUT/$1.log
  echo "  ($((SECONDS-S)) s)"
}
one warm 100 off e2e "dali"
one A 150 off "model e2e" "dali rrc pin both dali2 rrc2 pin2 both2"
one B 150 off "model e2e" "both2 pin2 rrc2 dali2 both pin rrc dali"
one R 170 reduce-overhead "model e2e" "dali rrc pin both"
echo "all: $((SECONDS-S)) s"
