#!/usr/bin/env bash
# run1.sh's best variant against the default in strict alternation: six e2e rows per process (default,
# hint, default, hint, ...; the repeats are the same settings under other names), two processes, after an
# untimed warm-up row, with the GPU's used memory sampled every 0.5 s (DALI's buffers are not torch's).
# OUT: one JSON per process (q1, q2), mem.csv, log.txt. 2026-12-03, 1xH200.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT=${1:?output folder}; mkdir -p "$OUT"
DATA=/tmp/gpu-benchmark-data-x8
COMMON="data=imagenet data.root=$DATA data.verify_files=false loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
HINT="loader.preallocate_width_hint=5980,loader.preallocate_height_hint=6430"
VARIANTS="--variant warm=dali:loader.hw_decoder_load=1.0
  --variant d2=dali:loader.hw_decoder_load=1.0 --variant d3=dali:loader.num_threads=8
  --variant h1=dali:$HINT --variant h2=dali:$HINT,loader.hw_decoder_load=1.0 --variant h3=dali:$HINT,loader.num_threads=8"
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 > "$OUT/mem.csv" &
SAMPLER=$!
for i in 1 2; do
  timeout 280 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off $VARIANTS \
    --loaders warm dali h1 d2 h2 d3 h3 --steps 100 --warmup 30 --repeats 3 --out /tmp/hints/q$i -- $COMMON 2>&1 \
    | grep --line-buffered -E "^(model|e2e) |rror" | while read -r l; do echo "$(date +%T.%N | cut -c1-12) q$i: $l"; done
  cp /tmp/hints/q$i/results.json "$OUT/q$i.json" 2>/dev/null
done | tee "$OUT/log.txt"
kill $SAMPLER
