#!/usr/bin/env python
"""Hold out part of a training set for choosing hyperparameters, so the real val split stays unseen.

    python scripts/split_holdout.py data/imagenette data/imagenette-holdout --fraction 0.2 --seed 0

DST/train/<class>/ and DST/val/<class>/ get symbolic links to SRC/train/<class>/ files: a seeded
`fraction` of each class goes to DST/val, the rest to DST/train. SRC/val is never read. Train on
DST with `data.root=DST`, pick the settings, then run them once on SRC.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

from dali_train.data.folder import IMAGE_EXTENSIONS


def split_class(files: list[str], fraction: float, rng: random.Random) -> tuple[list[str], list[str]]:
    """(train, held out): at least one file on each side when the class has two or more."""
    shuffled = sorted(files)
    rng.shuffle(shuffled)
    n_out = min(max(round(len(shuffled) * fraction), 1), len(shuffled) - 1) if len(shuffled) > 1 else 0
    return sorted(shuffled[n_out:]), sorted(shuffled[:n_out])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="dataset root with train/<class>/ folders")
    parser.add_argument("dst", type=Path, help="new root: train/ and val/ of links (must not exist)")
    parser.add_argument("--fraction", type=float, default=0.2, help="share of each class held out (0..1)")
    parser.add_argument("--seed", type=int, default=0, help="which files are held out")
    args = parser.parse_args(argv)
    train = args.src / "train"
    if not train.is_dir():
        sys.exit(f"error: {train}: no such folder (expected SRC/train/<class>/)")
    if not 0 < args.fraction < 1:
        sys.exit(f"error: --fraction={args.fraction}: must be between 0 and 1")
    if args.dst.exists():
        sys.exit(f"error: {args.dst}: exists; choose a new folder")
    rng = random.Random(args.seed)
    counts = {"train": 0, "val": 0}
    for cls in sorted(e.name for e in os.scandir(train) if e.is_dir() and not e.name.startswith(".")):
        files = [e.name for e in os.scandir(train / cls) if e.name.lower().endswith(IMAGE_EXTENSIONS)]
        for split, names in zip(("train", "val"), split_class(files, args.fraction, rng), strict=True):
            (args.dst / split / cls).mkdir(parents=True, exist_ok=True)
            for name in names:
                os.symlink((train / cls / name).resolve(), args.dst / split / cls / name)
            counts[split] += len(names)
    print(f"{args.dst}: {counts['train']} train / {counts['val']} held-out links from {train}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
