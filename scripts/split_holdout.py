#!/usr/bin/env python
"""Hold out part of a training set for choosing hyperparameters, so the real val split stays unseen.

    python scripts/split_holdout.py data/imagenette data/imagenette-holdout --fraction 0.2 --seed 0

DST/train/<class>/ and DST/val/<class>/ get symbolic links to SRC/train/<class>/ files: a seeded
`fraction` of each class goes to DST/val, the rest to DST/train. SRC/val is never read. Train on
DST with `data.root=DST`, pick the settings, then run them once on SRC. Files are listed as
train.py lists them; names that lead to one file (a link farm's symbolic or hard links), in one
class folder or in several, stay on one side, so no held-out image is also trained on. DST appears
complete or not at all (built in a hidden folder beside it, then renamed).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from dali_train.data.folder import list_images


def split_class(files: list[str], n_out: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """(train, held out) of distinct files: a seeded `n_out` of them held out."""
    shuffled = sorted(files)
    rng.shuffle(shuffled)
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
    classes = sorted(e.name for e in os.scandir(train) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        sys.exit(f"error: {train}: no class folders (expected SRC/train/<class>/)")
    plan = {}  # checked for every class before any link is made
    first_of: dict[tuple[int, int], str] = {}  # (device, inode) -> the realpath of its first name: hard links too
    side_of: dict[str, str] = {}  # a file -> its side, for every class that holds it
    for cls in classes:
        names_of: dict[str, list[str]] = {}  # a distinct file (the realpath of its first name) -> its names here
        for name in list_images(train / cls)[0]:
            path = train / cls / name
            info = os.stat(path)
            target = first_of.setdefault((info.st_dev, info.st_ino), os.path.realpath(path))
            names_of.setdefault(target, []).append(name)
        if len(names_of) < 2:
            sys.exit(f"error: {train / cls}: {len(names_of)} distinct image(s); holding one out needs 2 or more")
        # A file in several classes (a link farm, a dedup tool) keeps the side an earlier class gave it:
        # split per class alone, one class held it out while another trained on it
        free = [t for t in names_of if t not in side_of]
        n_out = min(max(round(len(names_of) * args.fraction), 1), len(names_of) - 1)
        n_out -= sum(side_of.get(t) == "val" for t in names_of)
        kept, held_out = split_class(free, min(max(n_out, 0), len(free)), rng)
        side_of.update({t: "train" for t in kept} | {t: "val" for t in held_out})
        plan[cls] = {side: [(t, names_of[t]) for t in sorted(names_of) if side_of[t] == side] for side in ("train", "val")}
        empty = next((side for side, targets in plan[cls].items() if not targets), None)
        if empty is not None:
            sys.exit(
                f"error: {train / cls}: no image left for {empty}: its files are all on the other side for other "
                "classes that hold them too (links between classes)"
            )
    # Built in a hidden folder beside DST and renamed into place: a split cut short (a kill) left a
    # DST of the first classes only, which loads as a smaller dataset without a word
    args.dst.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{args.dst.name}.partial-", dir=args.dst.parent))
    try:
        for cls in classes:
            for split, targets in plan[cls].items():
                (building / split / cls).mkdir(parents=True)
                for target, names in targets:
                    for name in names:
                        os.symlink(target, building / split / cls / name)
                    counts[split] += len(names)
        os.rename(building, args.dst)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    print(f"{args.dst}: {counts['train']} train / {counts['val']} held-out links from {train}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
