#!/usr/bin/env bash
# OLD_TREE: `git archive 0ba98f0 dali_train scripts train.py conf` unpacked; run from the repo root after `source .gpu/p3/unpack.sh`
# A/B in one machine session: ResNet-18 eager e2e at HEAD vs 0ba98f0 (measured 92-93% on 12-02 morning)
set -uo pipefail
export PYTHONUNBUFFERED=1
S=$SECONDS; mkdir -p $OUT
DATA=/tmp/bd8
PYTHONPATH=$PWD:${PYTHONPATH:-} python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 200 --val-per-class 10 --links 8 --workers $(nproc) 2>&1 | tail -1
echo "data: $((SECONDS-S)) s"
C="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
W="--steps 100 --warmup 30 --repeats 3"
one() {  # tree label modes
  (cd $1 && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 150 python scripts/benchmark.py --modes $3 --models resnet18 --compile off --loaders dali \
    $W --out /tmp/b8_$2 -- $C 2>&1 | grep -E "^\| (model|e2e)" | sed "s/^/$2 /")
  cp /tmp/b8_$2/results.json $OUT/$2.json 2>/dev/null
  echo "  ($((SECONDS-S)) s)"
}
one $PWD warmup e2e
one $PWD head1 "model e2e"
one $PWD/OLD_TREE old1 "model e2e"
one $PWD head2 e2e
one $PWD/OLD_TREE old2 e2e
one $PWD head3 e2e
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
echo "all: $((SECONDS-S)) s"
