#!/usr/bin/env bash
# DALI's GPU work per batch: YCbCr decode (no per-image rgba2rgb?) + one batched conversion; linear resize
# From the repo root after `source .gpu/p3/unpack.sh`, with OUT set; edits copies of the tree in /tmp (below).
# 2026-12-02 13:55 UTC, app at c46ea54.
set -uo pipefail
export PYTHONUNBUFFERED=1
S=$SECONDS; mkdir -p $OUT
DATA=/tmp/bd8
[ -d $DATA/val ] || PYTHONPATH=$PWD:$PYTHONPATH python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"
for v in ycc lin yl; do rm -rf /tmp/t_$v; mkdir -p /tmp/t_$v; cp -r dali_train scripts conf train.py /tmp/t_$v/; done
python - <<'PY'
import re
for v in ("ycc", "lin", "yl"):
    p = f"/tmp/t_{v}/dali_train/data/dali_graph.py"
    s = open(p).read()
    r = "images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_TRIANGULAR)"
    assert r in s
    if v in ("ycc", "yl"):
        s = s.replace("output_type=types.RGB,", "output_type=types.YCbCr,", 1)
    new = r
    if v in ("lin", "yl"):
        new = "images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=False)"
    if v in ("ycc", "yl"):
        new += "\n    images = fn.color_space_conversion(images, image_type=types.YCbCr, output_type=types.RGB)"
    s = s.replace(r, new)
    open(p, "w").write(s)
PY
grep -n "YCbCr\|INTERP_LINEAR" /tmp/t_*/dali_train/data/dali_graph.py
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
W="--steps 100 --warmup 30 --repeats 3"
one() {  # tree label modes
  (cd $1 && PYTHONPATH=$PWD:$PYTHONPATH timeout 150 python scripts/benchmark.py --modes $3 --models resnet18 --compile off --loaders dali \
    $W --out /tmp/b2_$2 -- $C 2>&1 | grep -E "^(model|e2e) " | sed "s/^/$2 /")
  cp /tmp/b2_$2/results.json $OUT/$2.json 2>/dev/null
  echo "  ($((SECONDS-S)) s)"
}
one $PWD warm e2e
one $PWD base1 "model e2e"
one /tmp/t_ycc ycc1 e2e
one /tmp/t_lin lin1 e2e
one /tmp/t_yl yl1 e2e
one $PWD base2 e2e
one /tmp/t_yl yl2 e2e
one /tmp/t_ycc ycc2 e2e
echo "all: $((SECONDS-S)) s"
