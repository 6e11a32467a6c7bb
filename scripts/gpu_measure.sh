#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md, in two parts that each fit one 10-minute call.
#   bash scripts/gpu_measure.sh part1 OUTDIR   # data, demo on CUDA, loader/model/e2e benchmark, decoder sweep
#   bash scripts/gpu_measure.sh part2 OUTDIR   # tuned loader sweep + benchmark, train.py resnet50 on 1 and 2 GPUs
#   bash scripts/gpu_measure.sh part3 OUTDIR   # torch.compile benchmark, train.py resnet50 3 epochs compile off/on
#   bash scripts/gpu_measure.sh part4 OUTDIR   # torch.profiler tables of resnet18 model-only vs e2e
#   bash scripts/gpu_measure.sh part5 OUTDIR   # why e2e < model-only: profiles and loader variants, 1 and 2 GPUs
#   bash scripts/gpu_measure.sh part6 OUTDIR   # default vs dedicated CUDA stream, profiled; 2-GPU resnet50
#   bash scripts/gpu_measure.sh part7 OUTDIR   # (after part6, same machine) final tables with part6's best setting
#   bash scripts/gpu_measure.sh part8 OUTDIR   # profiles of resnet50 e2e on 1 and 2 GPUs (about 2 minutes)
# Parts 6-7 ran at commit 438f96c: they set trainer.dedicated_stream, removed afterwards because it
# made no difference beyond run-to-run noise (docs/benchmarks.md); check that commit out to rerun them.
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

if [ ! -d $DATA ] && [[ $PART =~ ^part[1-4]$ ]]; then
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
if [ "$PART" = part5 ]; then
  # One 9-minute call on the 2-GPU machine. Variants of loader=dali, each a --variant of the benchmark:
  V="--variant dali-legacy=dali:loader.exec_dynamic=false --variant dali-d4=dali:loader.prefetch_queue_depth=4"
  V="$V --variant h90=dali:loader.hw_decoder_load=0.9 --variant h80=dali:loader.hw_decoder_load=0.8"
  V="$V --variant h90t12=dali:loader.hw_decoder_load=0.9,loader.num_threads=12 --variant t12=dali:loader.num_threads=12"
  V="$V --variant hint=dali:loader.preallocate_width_hint=640,loader.preallocate_height_hint=480"
  DATA=/tmp/synthetic-imagenet-40k
  T0=$(date +%s)
  left() { echo $((T0 + ${1:-500} - $(date +%s))); }
  if [ ! -d $DATA ]; then
    step "synthetic data: 100 classes x (400 train + 20 val), 500x375, ~110 KB"
    python scripts/make_synthetic_imagenet.py --out $DATA --classes 100 --train-per-class 400 --val-per-class 20 \
      --workers "$NCPU" 2>&1 | tail -1
  fi
  COMMON="data=imagenet data.root=$DATA loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
  export CUDA_VISIBLE_DEVICES=0
  step "A: resnet18 eager: model-only, e2e dali / legacy executor / depth 4 / pytorch(16), profiled"
  timeout 200 python scripts/benchmark.py --modes model e2e --models resnet18 --loaders dali dali-legacy dali-d4 pytorch \
    $V $PT --profile $RUNS/profA --out $RUNS/A -- $COMMON 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -40
  cp $RUNS/A/results.json "$OUT/A_rn18_eager.json"; cat $RUNS/profA/profile_*.txt > "$OUT/A_profiles.txt"
  step "B: the same e2e holding the last 4 batches (does releasing a DALI batch wait for the GPU?)"
  timeout 90 python scripts/benchmark.py --modes e2e --models resnet18 --loaders dali dali-legacy --hold-batches 4 \
    $V --out $RUNS/B -- $COMMON 2>&1 | grep -E "^e2e|÷"
  cp $RUNS/B/results.json "$OUT/B_rn18_hold4.json"
  step "C: loader-only variants"
  timeout 100 python scripts/benchmark.py --modes loader --loaders dali h90 h80 t12 h90t12 hint dali-legacy \
    $V --out $RUNS/C -- $COMMON 2>&1 | grep -E "^loader-only"
  cp $RUNS/C/results.json "$OUT/C_loader.json"
  unset CUDA_VISIBLE_DEVICES
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    for n in 2 1; do
      step "D: resnet50 eager, $n GPU(s): model-only and e2e dali / legacy"
      timeout 110 torchrun --standalone --nproc_per_node=$n scripts/benchmark.py --modes model e2e --models resnet50 \
        --loaders dali dali-legacy $V --out $RUNS/D$n -- $COMMON 2>&1 | grep -E "^(model|e2e)|÷"
      cp $RUNS/D$n/results.json "$OUT/D_rn50_${n}gpu.json"
    done
  fi
  export CUDA_VISIBLE_DEVICES=0
  step "F: compile on, resnet18 (time left: $(left) s)"
  timeout "$(left)" python scripts/benchmark.py --modes model e2e --models resnet18 --compile on \
    --loaders dali dali-legacy $V --out $RUNS/F -- $COMMON 2>&1 | grep -E "^(model|e2e)|÷"
  cp $RUNS/F/results.json "$OUT/F_rn18_compiled.json"
fi
D30=/tmp/synthetic-imagenet-30k
V6="--variant dali-legacy=dali:loader.exec_dynamic=false --variant h90=dali:loader.hw_decoder_load=0.9"
V6="$V6 --variant h95=dali:loader.hw_decoder_load=0.95"
C30="data=imagenet data.root=$D30 loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true"
if [ "$PART" = part6 ]; then
  T0=$(date +%s)
  if [ ! -d $D30 ]; then
    step "synthetic data: 100 classes x (300 train + 20 val), 500x375, ~110 KB"
    python scripts/make_synthetic_imagenet.py --out $D30 --classes 100 --train-per-class 300 --val-per-class 20 \
      --workers "$NCPU" 2>&1 | tail -1
  fi
  export CUDA_VISIBLE_DEVICES=0
  for ds in false true; do
    step "E: resnet18 eager, trainer.dedicated_stream=$ds: model-only, e2e dali / legacy executor, profiled"
    timeout 170 python scripts/benchmark.py --modes model e2e --models resnet18 --loaders dali dali-legacy pytorch $V6 $PT \
      --profile $RUNS/profE_$ds --out $RUNS/E_$ds -- $C30 trainer.dedicated_stream=$ds 2>&1 | grep -E "^(model|e2e|window|model|host|CUDA|profile)|÷"
    cp $RUNS/E_$ds/results.json "$OUT/E_rn18_stream_$ds.json"
    for f in $RUNS/profE_$ds/profile_*.txt; do echo "## $f"; head -14 "$f"; done > "$OUT/E_profiles_$ds.txt"
  done
  step "C: loader-only, hardware-decoder share"
  timeout 80 python scripts/benchmark.py --modes loader --loaders dali h95 h90 $V6 --out $RUNS/C6 -- $C30 2>&1 | grep -E "^loader-only"
  cp $RUNS/C6/results.json "$OUT/C_loader.json"
  unset CUDA_VISIBLE_DEVICES
  step "G: resnet50 eager, 2 GPUs, dedicated stream: model-only, e2e dali / legacy (time used $(( $(date +%s) - T0 )) s)"
  timeout 120 torchrun --standalone --nproc_per_node=2 scripts/benchmark.py --modes model e2e --models resnet50 \
    --loaders dali dali-legacy $V6 --out $RUNS/G2 -- $C30 trainer.dedicated_stream=true 2>&1 | grep -E "^(model|e2e)|÷"
  cp $RUNS/G2/results.json "$OUT/G_rn50_2gpu_stream_true.json"
fi
if [ "$PART" = part7 ]; then
  # The best (stream, executor) of part6's resnet18 e2e rows, by img/s.
  read -r DS LOADER < <(python - <<'PY'
import json
rows = [(r["img_s"], ds, r["loader"]) for ds in ("false", "true")
        for r in json.load(open(f"/tmp/runs/E_{ds}/results.json"))["rows"] if r["mode"] == "e2e" and r["loader"].startswith("dali")]
print(*max(rows)[1:])
PY
)
  EXTRA="trainer.dedicated_stream=$DS"; [ "$LOADER" = dali-legacy ] && EXTRA="$EXTRA loader.exec_dynamic=false"
  echo "part6's best: dedicated_stream=$DS loader=$LOADER -> overrides: $EXTRA"
  T0=$(date +%s)
  left() { echo $((T0 + ${1:-540} - $(date +%s))); }
  step "H: resnet50 eager, 1 GPU vs 2 GPUs ($EXTRA)"
  for n in 1 2; do
    timeout 110 torchrun --standalone --nproc_per_node=$n scripts/benchmark.py --modes model e2e --models resnet50 \
      --loaders dali --out $RUNS/H$n -- $C30 $EXTRA 2>&1 | grep -E "^(model|e2e)|÷"
    cp $RUNS/H$n/results.json "$OUT/H_rn50_${n}gpu.json"
  done
  export CUDA_VISIBLE_DEVICES=0
  step "I: compile on, resnet18 and resnet50 ($EXTRA; time left $(left) s)"
  timeout "$(left)" python scripts/benchmark.py --modes model e2e --models resnet18 resnet50 --compile on \
    --loaders dali --out $RUNS/I -- $C30 $EXTRA 2>&1 | grep -E "^(model|e2e)|÷"
  cp $RUNS/I/results.json "$OUT/I_compiled.json"
  unset CUDA_VISIBLE_DEVICES
  step "J: train.py resnet50, 2 GPUs, 2 epochs ($EXTRA; time left $(left 580) s)"
  timeout "$(left 580)" torchrun --standalone --nproc_per_node=2 train.py $C30 $EXTRA model=resnet50 trainer.epochs=2 \
    trainer.log_every_n_steps=20 hydra.run.dir=$RUNS/J 2>&1 | grep -E "epoch [0-9]+:|done:|rror" | tail -4
fi
if [ "$PART" = part8 ]; then
  # Short (about 2 minutes): profiles of resnet50 e2e on 1 and 2 GPUs, to see why 2-GPU e2e scales worse than model-only.
  D16=/tmp/synthetic-imagenet-16k
  [ -d $D16 ] || python scripts/make_synthetic_imagenet.py --out $D16 --classes 100 --train-per-class 160 --val-per-class 2 \
    --workers "$NCPU" 2>&1 | tail -1
  for n in 2 1; do
    step "K: resnet50 eager e2e dali, $n GPU(s), profiled"
    timeout 60 torchrun --standalone --nproc_per_node=$n scripts/benchmark.py --modes e2e --models resnet50 --loaders dali \
      --steps 30 --warmup 10 --repeats 1 --profile $RUNS/profK$n --out $RUNS/K$n -- data=imagenet data.root=$D16 \
      loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true 2>&1 | grep -E "^(e2e|window|model|host|CUDA|profile)"
    for f in $RUNS/profK$n/profile_*.txt; do echo "## $f"; head -16 "$f"; done > "$OUT/K_profiles_${n}gpu.txt"
  done
fi
step done
