#!/usr/bin/env python
"""Startup cost at ImageNet scale: listing + pre-flight check of N files, and the DALI pipeline build.

Makes (once) a tree of N small JPEGs in 1000 class folders, then times what train.py does before
its first step: `scan_dataset` (directory listing and the two-read header/trailer check of every
file, in threads) and building the train pipeline over the whole list until its first batch.

    python scripts/measure_startup.py --files 100000 --root /tmp/startup-100k
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from dali_train.config import DaliLoaderConfig  # noqa: E402
from dali_train.data.dali import DaliLoader, Placement, Transform  # noqa: E402
from dali_train.data.folder import scan_dataset  # noqa: E402
from dali_train.data.sample import synthetic_image  # noqa: E402
from dali_train.distributed import DistInfo  # noqa: E402


def make_tree(root: Path, files: int, classes: int) -> None:
    buf = io.BytesIO()
    synthetic_image(0, "train", 0, 0, 10, 64, 48, 8).save(buf, format="JPEG", quality=85)
    data = buf.getvalue()
    per_class = files // classes
    for split, n in (("train", per_class), ("val", max(1, per_class // 20))):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (d / f"{i:06d}.JPEG").write_bytes(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000, help="train files (val adds 5%%)")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--root", default="/tmp/dali-train-startup", help="where the tree is made (kept for reruns)")
    ap.add_argument("--clean", action="store_true", help="delete the tree afterwards")
    args = ap.parse_args()
    root = Path(args.root)
    if not (root / "val").is_dir():
        t = time.perf_counter()
        make_tree(root, args.files, args.classes)
        print(f"made {args.files} files in {time.perf_counter() - t:.1f} s (not part of startup)")
    t = time.perf_counter()
    ds = scan_dataset(str(root), verify=False)
    listing = time.perf_counter() - t
    t = time.perf_counter()
    ds = scan_dataset(str(root), verify=True)
    scan = time.perf_counter() - t
    settings = DaliLoaderConfig(name="dali_cpu", num_threads=4, device_memory_padding=0, host_memory_padding=0)
    transform = Transform((0.08, 1.0), (0.75, 4 / 3), 73, 64, (0.5,) * 3, (0.25,) * 3, False, False)
    t = time.perf_counter()
    loader = DaliLoader(
        ds.train,
        train=True,
        batch_size=256,
        dist=DistInfo(0, 0, 1),
        device=torch.device("cpu"),
        placement=Placement("cpu", False, None),
        settings=settings,
        transform=transform,
        seed=0,
        train_size_at=lambda e: 64,
    )
    loader.set_epoch(0)
    next(iter(loader))
    build = time.perf_counter() - t
    print(
        f"{len(ds.train) + len(ds.val)} files: listing {listing:.1f} s; listing + pre-flight check {scan:.1f} s; "
        f"DALI train pipeline build + first batch {build:.1f} s"
    )
    if args.clean:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
