#!/usr/bin/env python
"""Copy an ImageNet-layout folder with every image shrunk, aspect kept, to a longest side of N px
(`--max-side`, FFCV's 500 px ImageNet) or a shorter side of N px (`--shorter-side`, fastai's 160 px
and 320 px Imagenette and Imagewoof): smaller files, faster decode, same layout.

    python scripts/resize_dataset.py data/imagenet data/imagenet-500 --max-side 500 --quality 90
    python scripts/resize_dataset.py data/imagewoof2-320 data/imagewoof2-160 --shorter-side 160

Images already within N px are re-encoded only if they are not JPEG; output files are JPEG with the
original name. Files that fail to decode are reported and skipped. Existing outputs are kept, so
an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from dali_train.cli import at_least
from dali_train.data.pil_image import as_rgb

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def resize_one(job: tuple[str, str, int, bool, int]) -> str | None:
    """None when written, "kept" when dst was there (a rerun resumes), else the error. `shorter`: the
    side capped at `side` px is the shorter one, else the longer one."""
    src, dst, side, shorter, quality = job
    if os.path.exists(dst):
        return "kept"
    try:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = dst + ".tmp"
        with Image.open(src) as im:
            measured = min if shorter else max
            if measured(im.size) <= side and im.format == "JPEG":
                im.load()  # decodes (a bad file is reported); small enough: its bytes, no second JPEG loss
                shutil.copyfile(src, tmp)
            else:
                im = as_rgb(im)
                if measured(im.size) > side:
                    scale = side / measured(im.size)
                    im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.LANCZOS)
                im.save(tmp, format="JPEG", quality=quality)
        os.replace(tmp, dst)
    except Exception as e:  # noqa: BLE001 - report any undecodable file, keep going
        return f"{src}: {type(e).__name__}: {e}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="dataset folder: <split>/<class>/<image>")
    ap.add_argument("dst", help="output folder (same layout)")
    sides = ap.add_mutually_exclusive_group()
    sides.add_argument("--max-side", type=at_least(1), help="longest side after resizing, px (default 160)")
    sides.add_argument("--shorter-side", type=at_least(1), help="shorter side after resizing, px (fastai's copies)")
    ap.add_argument("--quality", type=at_least(1, high=100), default=90, help="JPEG quality (default 90)")
    ap.add_argument("--workers", type=at_least(1), default=os.cpu_count(), help="processes (default: all cores)")
    args = ap.parse_args()
    src, dst = Path(args.src), Path(args.dst)
    if not src.is_dir():
        sys.exit(f"error: {src}: no such folder")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents or dst.resolve() in src.resolve().parents:
        sys.exit(f"error: {dst}: the output must be a folder outside {src} (and not holding it)")
    shorter = args.shorter_side is not None
    side = args.shorter_side if shorter else (args.max_side or 160)
    jobs = [
        (str(p), str(dst / p.relative_to(src)), side, shorter, args.quality)
        for p in sorted(src.glob("*/*/*"))
        # dotfiles (macOS's ._x.JPEG, hidden folders) are not images of the set: the loaders skip them too
        if p.suffix.lower() in EXTENSIONS and not any(part.startswith(".") for part in p.relative_to(src).parts)
    ]
    if not jobs:
        sys.exit(f"error: {src}: no images under <split>/<class>/")
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(tqdm(pool.map(resize_one, jobs, chunksize=32), total=len(jobs), unit="img", disable=None))
    errors = [r for r in results if r and r != "kept"]
    kept = results.count("kept")
    for e in errors[:20]:
        print(f"skipped {e}", file=sys.stderr)
    size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    print(
        f"{len(jobs) - len(errors) - kept} images written to {dst} ({size / 2**20:.1f} MiB there); {len(errors)} skipped; "
        f"{kept} already there, kept as they are (not checked against the side)"
    )


if __name__ == "__main__":
    main()
