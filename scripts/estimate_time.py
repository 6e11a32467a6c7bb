#!/usr/bin/env python
"""Estimated wall time of a recipe from measured throughput (a dry run: nothing is trained).

Per epoch: train images / (img/s at the recipe's crop size × GPUs × scaling efficiency), where
img/s comes from a benchmark measured at 224 px (scripts/benchmark.py's results.json: the e2e
row of the recipe's model with loader=dali) and scales with pixel count to the epoch's crop size
(progressive resizing included). Validation and pipeline builds are not counted.

    python scripts/estimate_time.py --benchmark docs/h200/part2_bench_eager.json --gpus 1 8 --scaling 0.86 \\
        imagenet_rn50_ffcv_16ep imagenet_rn50_90ep
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from dali_train.cli import above, at_least
from dali_train.config import register_configs
from dali_train.data import progressive_size

IMAGENET_TRAIN = 1_281_167

REPO = Path(__file__).resolve().parents[1]


def measured_img_s(benchmark: Path, model: str) -> float:
    """One GPU's eager e2e img/s: a benchmark of several processes reports all of them together."""
    result = json.loads(benchmark.read_text())
    processes = result.get("env", {}).get("processes", 1)
    for r in result["rows"]:
        if r["mode"] == "e2e" and r["loader"] == "dali" and r["model"] == model and r.get("compile", "off") == "off":
            return r["img_s"] / processes
    sys.exit(f"error: --benchmark {benchmark}: no eager e2e dali row for model {model}; pass --img-s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="+", help="names in conf/experiment/")
    ap.add_argument("--benchmark", type=Path, help="results.json of scripts/benchmark.py (one GPU, 224 px)")
    ap.add_argument("--img-s", type=above(0), help="one-GPU training img/s at --res instead of --benchmark")
    ap.add_argument("--res", type=at_least(1), default=224, help="crop size the img/s was measured at")
    ap.add_argument("--gpus", type=at_least(1), nargs="+", default=[1, 8])
    ap.add_argument("--scaling", type=above(0), default=0.9, help="multi-GPU efficiency (measured 2-GPU value)")
    ap.add_argument("--train-images", type=at_least(1), help=f"per epoch (default: {IMAGENET_TRAIN:,} for data=imagenet recipes)")
    args = ap.parse_args()
    if not (args.benchmark or args.img_s):
        sys.exit("error: give --benchmark results.json or --img-s")
    if args.benchmark and not args.benchmark.is_file():
        sys.exit(f"error: --benchmark {args.benchmark}: no such file")
    unknown = [r for r in args.recipes if not (REPO / "conf" / "experiment" / f"{r}.yaml").is_file()]
    if unknown:
        sys.exit(f"error: {unknown[0]}: no recipe conf/experiment/{unknown[0]}.yaml")
    register_configs()
    print("| recipe | model | epochs | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in args.gpus) + " |")
    print("|---|---|---:|" + "---:|" * len(args.gpus))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for recipe in args.recipes:
            cfg = compose("config", overrides=[f"+experiment={recipe}", "data.root=/data"])
            base = args.img_s or measured_img_s(args.benchmark, cfg.model.name)
            if args.train_images is None and cfg.data.name != "imagenet":  # ImageNet's count would be wrong
                sys.exit(f"error: {recipe} trains on data={cfg.data.name}: give its --train-images")
            images = args.train_images or IMAGENET_TRAIN
            size_at = progressive_size(cfg.data)
            seconds = sum(images / (base * (args.res / size_at(e)) ** 2) for e in range(cfg.trainer.epochs))
            cells = [seconds / (g * (args.scaling if g > 1 else 1.0)) / 3600 for g in args.gpus]
            print(
                f"| {recipe} | {cfg.model.name} | {cfg.trainer.epochs} | "
                + " | ".join(f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min" if h >= 1 / 60 else f"{h * 3600:.0f} s" for h in cells)
                + " |"
            )


if __name__ == "__main__":
    main()
