#!/usr/bin/env bash
# check.py on the GPU (loader=dali), 2,000 synthetic JPEGs: 7 steps of 256 per epoch. From the repo root after
# `source .gpu/p3/unpack.sh`. 2026-12-02, app at d452771.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
D=/tmp/lifetime-data
[ -d $D/val ] || python scripts/make_synthetic_imagenet.py --out $D --classes 100 --train-per-class 20 --val-per-class 2 --workers $(nproc) 2>&1 | tail -1
python docs/h200/pipeline_lifetime_2026-12-02/check.py $D cuda:0 2>&1 | grep -vE "nvjpeg2k|nvtiff|nvImageCodec|^\s*$"
