#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md, in two parts that each fit one 10-minute call.
#   bash scripts/gpu_measure.sh part1 OUTDIR   # data, demo on CUDA, loader/model/e2e benchmark, decoder sweep
#   bash scripts/gpu_measure.sh part2 OUTDIR   # tuned loader sweep + benchmark, train.py resnet50 on 1 and 2 GPUs
#   bash scripts/gpu_measure.sh part3 OUTDIR   # torch.compile benchmark, train.py resnet50 3 epochs compile off/on
#   bash scripts/gpu_measure.sh part4 OUTDIR   # torch.profiler tables of resnet18 model-only vs e2e (not yet run)
# Needs DALI and Hydra importable (on the lent H200: source .gpu/p3/unpack.sh first).
set -uo pipefail
PART=${1:?part1 or part2}
OUT=${2:?output folder}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DATA=/tmp/synthetic-imagenet
RUNS=/tmp/runs  # full run dirs stay here; summaries are copied to OUT (few files travel back)
NCPU=$(nproc)
step() { echo "=== $* ($(date +%T))"; }

if [ ! -d $DATA ]; then
  step "synthetic ImageNet-like data: 100 classes x (250 train + 20 val), 500x375, ~110 KB"
  python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 250 --val-per-class 20 \
    --workers "$NCPU" 2>&1 | tail -1
fi
COMMON="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
PT="--loader-set pytorch:loader.num_workers=16 --loader-set dali_cpu:loader.num_threads=$((NCPU - 1))"

if [ "$PART" = part1 ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, timm, nvidia.dali as d; print('torch', torch.__version__, 'timm', timm.__version__, 'dali', d.__version__)"
  step "demo on CUDA: python train.py trainer.device=cuda"
  timeout 200 python train.py trainer.device=cuda hydra.run.dir=$RUNS/demo 2>&1 | grep -E "epoch [0-9]+:|done:|rror" | tail -8
  cp $RUNS/demo/summary.json "$OUT/demo_summary.json"
  step "benchmark, compile off"
  timeout 300 python scripts/benchmark.py --compare --models resnet50 resnet18 --loaders dali dali_cpu pytorch $PT \
    --out "$OUT/bench_eager" -- $COMMON 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -30
  step "hardware-decoder share and DALI threads, loader-only"
  for t in 4 8; do for h in 0.65 1.0; do
    timeout 60 python scripts/benchmark.py --modes loader --loaders dali --out $RUNS/sweep_t${t}_h${h} -- $COMMON \
      loader.num_threads=$t loader.hw_decoder_load=$h 2>&1 | grep "loader-only" | sed "s/^/threads=$t hw_decoder_load=$h: /"
  done; done
fi

if [ "$PART" = part2 ]; then
  step "loader-only dali: more threads, deeper prefetch (hw_decoder_load=1.0)"
  for v in "loader.num_threads=12" "loader.num_threads=16" "loader.prefetch_queue_depth=3"; do
    CUDA_VISIBLE_DEVICES=0 timeout 60 python scripts/benchmark.py --modes loader --loaders dali --out $RUNS/sweep -- $COMMON $v \
      2>&1 | grep "loader-only" | sed "s/^/$v: /"
  done
  step "benchmark with the tuned loader=dali defaults, compile off"
  CUDA_VISIBLE_DEVICES=0 timeout 300 python scripts/benchmark.py --compare --models resnet50 resnet18 --loaders dali pytorch \
    $PT --out "$OUT/bench_eager_tuned" -- $COMMON 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -22
  step "train.py: resnet50, loader=dali, 2 epochs, 1 GPU"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python train.py $COMMON model=resnet50 trainer.epochs=2 trainer.log_every_n_steps=50 \
    hydra.run.dir=$RUNS/rn50_2ep 2>&1 | grep -E "epoch [0-9]+:|done:|rror|data:" | tail -6
  cp $RUNS/rn50_2ep/summary.json "$OUT/rn50_2ep_1gpu_summary.json"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step "train.py: resnet50, loader=dali, 2 epochs, 2 GPUs (torchrun)"
    timeout 150 torchrun --standalone --nproc_per_node=2 train.py $COMMON model=resnet50 trainer.epochs=2 \
      trainer.log_every_n_steps=50 hydra.run.dir=$RUNS/rn50_2ep_2gpu 2>&1 | grep -E "epoch [0-9]+:|done:|rror|data:" | tail -6
    cp $RUNS/rn50_2ep_2gpu/summary.json "$OUT/rn50_2ep_2gpu_summary.json"
  fi
fi

if [ "$PART" = part3 ]; then
  export CUDA_VISIBLE_DEVICES=0
  step "benchmark, compile on"
  timeout 330 python scripts/benchmark.py --compare --models resnet50 resnet18 --loaders dali --compile on \
    --out "$OUT/bench_compiled" -- $COMMON 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -14
  for c in false true; do
    step "train.py: resnet50, 3 epochs, bf16, channels_last, compile=$c"
    timeout 200 python train.py $COMMON model=resnet50 trainer.epochs=3 trainer.compile=$c \
      trainer.log_every_n_steps=50 hydra.run.dir=$RUNS/rn50_3ep_compile_$c 2>&1 | grep -E "epoch [0-9]+:|done:|rror" | tail -6
    cp $RUNS/rn50_3ep_compile_$c/metrics.jsonl "$OUT/rn50_3ep_compile_${c}_metrics.jsonl"
  done
fi
if [ "$PART" = part4 ]; then
  export CUDA_VISIBLE_DEVICES=0
  step "profile: resnet18 model-only and e2e dali, eager (what shares the GPU with the model?)"
  timeout 300 python scripts/benchmark.py --modes model e2e --loaders dali --models resnet18 \
    --profile "$OUT/profile" --out "$OUT/bench_profiled" -- $COMMON 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -8
  head -30 "$OUT"/profile/profile_resnet18_dali_compile0.txt
  rm -f "$OUT"/profile/trace_*.json  # large; the tables come back
fi
step done
