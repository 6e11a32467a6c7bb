#!/usr/bin/env python
"""Sort the flat ILSVRC2012 validation folder into class folders: val/<wnid>/<file>.JPEG.

The 50,000 val images ship flat (ILSVRC2012_val_00000001.JPEG ...); training tools want
val/<class>/. Ground truth, in either form:
  --labels LOC_val_solution.csv         Kaggle's CSV: ImageId,PredictionString ("n01751748 x y ...")
  --labels ground_truth.txt --synsets synsets.txt
                                        devkit's ILSVRC2012_validation_ground_truth.txt (one class
                                        ID 1..1000 per line, in file order) and the 1000 wnids in
                                        ILSVRC2012 ID order (one per line; the devkit's meta.mat
                                        order, ID 1 = n02119789: an alphabetical list is refused)

    python scripts/prepare_imagenet_val.py /data/imagenet/val --labels LOC_val_solution.csv --dry-run
    python scripts/prepare_imagenet_val.py /data/imagenet/val --labels LOC_val_solution.csv

Files are moved (one rename each) or --copy'd (through a temporary dotfile renamed into place) inside
the val folder, so a rerun after an interruption resumes and never keeps a half-copied file; nothing
is overwritten; --dry-run only prints.
"""

from __future__ import annotations

import argparse
import csv
import errno
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

from tqdm import tqdm


def read_labels(labels: Path, synsets: Path | None, files: list[str]) -> dict[str, str]:
    """file stem -> wnid."""
    if labels.suffix == ".csv":
        # utf-8-sig: a CSV saved by Excel starts with a byte-order mark, which hid the ImageId column
        with open(labels, newline="", encoding="utf-8-sig") as f:
            rows = csv.DictReader(f)
            if not rows.fieldnames or not {"ImageId", "PredictionString"} <= set(rows.fieldnames):
                sys.exit(f"error: --labels {labels}: expected the columns ImageId,PredictionString")
            by_id = {}
            for line, r in enumerate(rows, start=2):
                if not (r["PredictionString"] or "").split():
                    sys.exit(f"error: --labels {labels}: line {line} ({r['ImageId']}) has no class")
                by_id[r["ImageId"]] = r["PredictionString"].split()[0]
            return by_id
    if synsets is None:
        sys.exit(f"error: --labels {labels}: a ground-truth ID list needs --synsets (the 1000 wnids in ID order)")
    if not synsets.is_file():
        sys.exit(f"error: --synsets {synsets}: no such file")
    wnids = [line.split()[0] for line in synsets.read_text().splitlines() if line.strip()]
    repeated = next((w for w, n in Counter(wnids).items() if n > 1), None)
    if repeated is not None:
        sys.exit(f"error: --synsets {synsets}: {repeated} is listed {wnids.count(repeated)} times; each wnid once, in ID order")
    if len(wnids) == 1000 and wnids == sorted(wnids):
        # The lists at hand (LOC_synset_mapping.txt, Caffe's and timm's synsets.txt) are alphabetical;
        # the devkit's IDs are meta.mat's ILSVRC2012_ID order (ID 1 is n02119789): every image would
        # land in another class's folder, without a word
        sys.exit(
            f"error: --synsets {synsets}: alphabetical, not the devkit's ILSVRC2012_ID order (ID 1 is n02119789, "
            "data/meta.mat); give the wnids in ID order, or use --labels LOC_val_solution.csv"
        )
    words = labels.read_text().split()
    bad = next((w for w in words if not w.isdigit()), None)
    if bad is not None or not words:
        sys.exit(
            f"error: --labels {labels}: expected one class ID (1..{len(wnids)}) per line"
            + (f", found {bad!r}" if bad is not None else ", found none")
        )
    ids = [int(w) for w in words]
    if min(ids) < 1:  # 0-based IDs would shift every label by one class, silently
        sys.exit(f"error: --labels {labels}: class IDs start at 1 (the devkit's), this list has {min(ids)}")
    if max(ids) > len(wnids):
        sys.exit(f"error: --synsets {synsets}: {len(wnids)} wnids, but labels go up to {max(ids)}")
    # Line N is ILSVRC2012_val_<N>'s label: by name, so a run interrupted after some moves resumes
    by_name = {f"ILSVRC2012_val_{n:08d}": wnids[i - 1] for n, i in enumerate(ids, start=1)}
    if all(Path(f).stem in by_name for f in files):
        return by_name
    if len(ids) != len(files):  # other names: the list's order is the sorted files'
        sys.exit(f"error: --labels {labels}: {len(ids)} labels for {len(files)} images in the folder")
    return {Path(f).stem: wnids[i - 1] for f, i in zip(sorted(files), ids, strict=True)}


def rename_across(src: Path, dst: Path) -> bool:
    """Rename `src` to `dst` (atomic); False when they are on two filesystems."""
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("val_dir", help="the flat folder of validation images")
    ap.add_argument("--labels", required=True, help="LOC_val_solution.csv, or the devkit's ground-truth ID list")
    ap.add_argument("--synsets", help="the 1000 wnids in ILSVRC2012 ID order (with a ground-truth ID list)")
    ap.add_argument("--copy", action="store_true", help="copy instead of move")
    ap.add_argument("--dry-run", action="store_true", help="print what would happen, change nothing")
    args = ap.parse_args()
    val = Path(args.val_dir)
    if not val.is_dir():
        sys.exit(f"error: {val}: no such folder")
    files = sorted(  # dotfiles (macOS's ._x.JPEG) are no images of the set: the loaders skip them too
        p.name
        for p in val.iterdir()
        if p.is_file() and p.suffix.lower() in (".jpeg", ".jpg") and not p.name.startswith(".")
    )
    if not files:
        sys.exit(f"error: {val}: no flat .JPEG files (already sorted into class folders?)")
    labels_path = Path(args.labels)
    if not labels_path.is_file():
        sys.exit(f"error: --labels {labels_path}: no such file")
    try:
        wnid_of = read_labels(labels_path, Path(args.synsets) if args.synsets else None, files)
    except UnicodeDecodeError as e:  # a binary file or another encoding given as --labels or --synsets
        which = f"--labels {labels_path}" + (f" or --synsets {args.synsets}" if args.synsets else "")
        sys.exit(f"error: {which}: not UTF-8 text ({e.reason} at byte {e.start})")
    missing = [f for f in files if Path(f).stem not in wnid_of]
    if missing:
        sys.exit(f"error: --labels {labels_path}: no label for {len(missing)} files, e.g. {missing[0]}")
    per_class = Counter(wnid_of[Path(f).stem] for f in files)
    print(
        f"{len(files)} images -> {len(per_class)} class folders ({min(per_class.values())}-"
        f"{max(per_class.values())} images each)"
    )
    if args.dry_run:
        for f in files[:5]:
            print(f"  {f} -> {wnid_of[Path(f).stem]}/{f}")
        print("dry run: nothing changed")
        return
    for f in tqdm(files, unit="file", disable=None):  # renames within one filesystem: one process is enough
        target = val / wnid_of[Path(f).stem] / f
        if target.exists():
            continue
        try:
            target.parent.mkdir(exist_ok=True)
            if not args.copy and rename_across(val / f, target):
                continue
            # A copy goes through a dotfile (the loaders skip dotfiles) renamed into place: one cut
            # short by a kill or a full disk left a truncated target that a rerun kept as done
            tmp = target.parent / f".{f}.tmp"
            shutil.copy2(val / f, tmp)
            os.replace(tmp, target)
            if not args.copy:  # a move to another filesystem (a class folder that is a mount point)
                os.unlink(val / f)
        except OSError as e:
            sys.exit(f"error: {val / f} -> {target}: {e.strerror or e}; rerun to resume (files done are kept)")
    print(f"done: {val}/<wnid>/")


if __name__ == "__main__":
    main()
