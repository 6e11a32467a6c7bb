#!/usr/bin/env bash
# diag.py, then check.py of 2026-12-02, on the GPU (loader=dali), 2,000 synthetic JPEGs. From the repo
# root after `source .gpu/p3/unpack.sh`. 2026-12-03, app at aa0ce71 with the Endless fix.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
D=/tmp/lifetime-data
[ -d $D/val ] || python scripts/make_synthetic_imagenet.py --out $D --classes 100 --train-per-class 20 --val-per-class 2 --workers 4 2>&1 | tail -1
python docs/h200/pipeline_lifetime_2026-12-03/diag.py $D cuda:0 2>&1 | grep -vE "nvjpeg2k|nvtiff|nvImageCodec|^\s*$"
python docs/h200/pipeline_lifetime_2026-12-02/check.py $D cuda:0 2>&1 | grep -vE "nvjpeg2k|nvtiff|nvImageCodec|^\s*$"
