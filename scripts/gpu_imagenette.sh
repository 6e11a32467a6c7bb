#!/usr/bin/env bash
# Imagenette recipes on one GPU: 3 seeds of a recipe run concurrently (a 128 px ResNet-50 leaves
# most of an H200 idle), then mean ± std of best val top-1. Used for docs/recipes.md.
#   bash scripts/gpu_imagenette.sh DATA_ROOT OUTDIR imagenette_128_5ep [imagenette_128_20ep ...]
set -uo pipefail
DATA=${1:?data root}; OUT=${2:?output folder}; shift 2
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
for recipe in "$@"; do
  echo "=== $recipe, seeds 0 1 2 ($(date +%T))"
  start=$(date +%s)
  for seed in 0 1 2; do
    timeout 330 python train.py +experiment=$recipe data.root=$DATA seed=$seed loader.num_threads=4 \
      trainer.log_every_n_steps=1000 hydra.run.dir=/tmp/runs/${recipe}_s$seed > /tmp/runs_${recipe}_s$seed.log 2>&1 &
  done
  wait
  echo "wall time for 3 concurrent seeds: $(( $(date +%s) - start )) s"
  for seed in 0 1 2; do grep -E "rror|done:" /tmp/runs_${recipe}_s$seed.log | tail -2; done
  python - "$recipe" "$OUT" <<'PY'
import json, statistics, sys, pathlib
recipe, out = sys.argv[1], pathlib.Path(sys.argv[2])
rows = [json.loads(pathlib.Path(f"/tmp/runs/{recipe}_s{s}/summary.json").read_text()) for s in range(3)
        if pathlib.Path(f"/tmp/runs/{recipe}_s{s}/summary.json").is_file()]
top1 = [r["val_top1"] for r in rows]
res = {"recipe": recipe, "seeds": len(rows), "val_top1": top1, "mean": statistics.mean(top1) if top1 else None,
       "std": statistics.stdev(top1) if len(top1) > 1 else None, "best_val_top1": [r["best_val_top1"] for r in rows],
       "wall_time_s": [r["wall_time_s"] for r in rows], "val_samples": [r["val_samples"] for r in rows]}
(out / f"{recipe}.json").write_text(json.dumps(res, indent=1))
print(json.dumps(res))
PY
done
