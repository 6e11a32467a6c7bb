#!/usr/bin/env python
"""Write a synthetic ImageNet-layout JPEG folder: N classes × M images, deterministic.

Realistic for loader benchmarks: ~500×375 px and ~110 KB per file by default (ImageNet's average),
with a learnable class signal (stripe angle and hue) so accuracy tests mean something. `--links N`
makes every train JPEG appear N times (N-1 symlinks): epochs as long as a benchmark needs, in seconds.

    python scripts/make_synthetic_imagenet.py --out data/synthetic --classes 100 --train-per-class 200 --links 8
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from dali_train.cli import at_least
from dali_train.data.sample import make_image_folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (must not exist)")
    ap.add_argument("--classes", type=at_least(1), default=100, help="number of classes (default 100)")
    ap.add_argument("--train-per-class", type=at_least(1), default=100, help="train images per class")
    ap.add_argument("--val-per-class", type=at_least(1), default=20, help="val images per class")
    ap.add_argument("--width", type=at_least(1), default=500, help="image width, px (default 500)")
    ap.add_argument("--height", type=at_least(1), default=375, help="image height, px (default 375)")
    ap.add_argument("--quality", type=at_least(1, high=100), default=90, help="JPEG quality (default 90)")
    ap.add_argument(
        "--noise", type=at_least(0, float), default=36.0, help="pixel noise std; sets file size (36 -> ~110 KB at 500x375)"
    )
    ap.add_argument(
        "--links", type=at_least(1), default=1, help="entries per train JPEG: N-1 symlinks beside each (default 1: none)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=at_least(1), default=os.cpu_count(), help="processes (default: all cores)")
    args = ap.parse_args()
    if Path(args.out).exists():
        sys.exit(f"error: --out {args.out} exists; choose a new folder")
    total = args.classes * (args.train_per_class + args.val_per_class)
    start = time.perf_counter()
    with tqdm(total=total, unit="img", disable=None) as bar:
        root = make_image_folder(
            args.out,
            num_classes=args.classes,
            train_per_class=args.train_per_class,
            val_per_class=args.val_per_class,
            width=args.width,
            height=args.height,
            quality=args.quality,
            noise=args.noise,
            seed=args.seed,
            workers=args.workers,
            progress=bar.update,
            train_links=args.links,
        )
    size = sum(f.stat().st_size for f in root.rglob("*.JPEG") if not f.is_symlink())  # each JPEG once, not per link
    print(f"{total} images, {size / total / 1e3:.0f} KB average, in {root} ({time.perf_counter() - start:.0f} s)")
    if args.links > 1:
        print(f"train: {args.classes * args.train_per_class * args.links} entries ({args.links} per JPEG)")


if __name__ == "__main__":
    main()
