#!/usr/bin/env bash
# The Imagenette recipes as docs/recipes.md reports them: both recipes × seeds 0, 1, 2 at once,
# round-robin over the GPUs (CUDA_VISIBLE_DEVICES's, or all; a 128 px model leaves most of an H200
# idle), then mean ± std and time to accuracy.
#   bash scripts/gpu_imagenette.sh DATA_ROOT OUTDIR [RECIPE ...]   (default: both imagenette_128 recipes)
set -uo pipefail
DATA=${1:?data root}; OUT=${2:?output folder}; shift 2
RECIPES=${*:-imagenette_128_5ep imagenette_128_20ep}
export PYTHONUNBUFFERED=1
if [ -n "$(ls -A "$OUT/runs" 2>/dev/null)" ]; then  # the summary would be of the old runs (train.py refuses a new one there)
  echo "error: $OUT/runs holds runs already; choose a new OUTDIR" >&2; exit 2
fi
mkdir -p "$OUT/runs"
runs=() pids=()
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
IFS=, read -ra devices <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $(( gpus > 0 ? gpus - 1 : 0 )))}"
start=$(date +%s)
for recipe in $RECIPES; do
  for seed in 0 1 2; do
    dir=$OUT/runs/${recipe}_s$seed
    CUDA_VISIBLE_DEVICES=${devices[${#runs[@]} % ${#devices[@]}]} python train.py +experiment="$recipe" data.root="$DATA" seed=$seed loader.num_threads=3 \
      hydra.run.dir="$dir" > "$OUT/runs/${recipe}_s$seed.log" 2>&1 &
    runs+=("$dir") pids+=($!)
  done
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { failed=1; echo "error: ${runs[$i]} failed; see its .log" >&2; }
done
echo "all runs: $(( $(date +%s) - start )) s"
python scripts/recipe_summary.py "${runs[@]}" | tee "$OUT/recipes.md"
exit $failed
