"""Synthetic ImageNet-layout JPEG folders with a learnable class signal.

Each class has its own stripe orientation and hue, drawn inside a randomly placed disc on a noisy
background, so a model can learn the classes (accuracy means something) while random crops and
flips still change every view. Everything derives from (seed, split, class, index): the same
arguments give the same bytes. Used by `data=sample` (the demo, generated on first use), by the
tests, and by `scripts/make_synthetic_imagenet.py` for benchmark-sized sets.
"""

from __future__ import annotations

import colorsys
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image


def class_name(c: int) -> str:
    return f"n{c:08d}"  # ImageNet-style wnid, sorted order == class index


def synthetic_image(
    seed: int, split: str, c: int, i: int, num_classes: int, width: int, height: int, noise: float
) -> Image.Image:
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, c, i])
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    # Background: smooth random colour field plus pixel noise (the noise sets the JPEG size).
    grid = rng.uniform(40, 215, size=(4, 4, 3)).astype(np.float32)
    bg = np.asarray(Image.fromarray(grid.astype(np.uint8)).resize((width, height), Image.BILINEAR), np.float32)
    bg += rng.normal(0, noise, size=bg.shape).astype(np.float32)
    # Class signal: stripes of a class-specific angle and hue inside a disc.
    angle = np.pi * c / num_classes
    period = rng.uniform(0.06, 0.12) * min(width, height)
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period + rng.uniform(0, 6.3))
    hue = (c / num_classes + rng.normal(0, 0.02)) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, 0.9, 1.0), np.float32) * 255
    cx, cy = rng.uniform(0.3, 0.7) * width, rng.uniform(0.3, 0.7) * height
    radius = rng.uniform(0.25, 0.45) * min(width, height)
    disc = (((xx - cx) ** 2 + (yy - cy) ** 2) < radius**2)[..., None]
    img = np.where(disc, stripes[..., None] * colour + (1 - stripes[..., None]) * 0.3 * bg, bg)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _write_class(args: tuple) -> int:
    out, split, c, count, seed, num_classes, width, height, quality, noise = args
    folder = Path(out) / split / class_name(c)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img = synthetic_image(seed, split, c, i, num_classes, width, height, noise)
        img.save(folder / f"{class_name(c)}_{i:06d}.JPEG", quality=quality)
    return count


def make_image_folder(
    root: str | os.PathLike,
    *,
    num_classes: int = 10,
    train_per_class: int = 40,
    val_per_class: int = 10,
    width: int = 80,
    height: int = 80,
    quality: int = 90,
    noise: float = 12.0,
    seed: int = 0,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
    train_links: int = 1,
) -> Path:
    """Write `root/{train,val}/<class>/*.JPEG`, each train JPEG listed `train_links` times
    (`link_copies`); built in a temp folder and renamed into place, links included, so a concurrent
    or interrupted run never leaves a half-written dataset at `root` (nor one whose classes have
    different numbers of copies: a biased train set that a rerun would refuse to replace)."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    jobs = [
        (str(tmp), split, c, n, seed, num_classes, width, height, quality, noise)
        for split, n in (("train", train_per_class), ("val", val_per_class))
        for c in range(num_classes)
    ]
    try:
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                for n in pool.map(_write_class, jobs):
                    progress and progress(n)
        else:
            for job in jobs:
                n = _write_class(job)
                progress and progress(n)
        if train_links > 1:
            link_copies(tmp, "train", train_links)
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished first: keep theirs
            if not (root / "val").is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def link_copies(root: str | os.PathLike, split: str, copies: int) -> int:
    """Make every JPEG of `root/split` appear `copies` times: the file plus `copies - 1` relative
    symlinks beside it (`<stem>_l<k>.JPEG`). Long epochs for benchmarks in seconds, without
    writing more image bytes. Returns the number of entries in the split."""
    entries = 0
    for folder in sorted(p for p in (Path(root) / split).iterdir() if p.is_dir()):
        originals = sorted(f for f in folder.iterdir() if f.suffix == ".JPEG" and not f.is_symlink())
        for f in originals:
            for k in range(1, copies):
                os.symlink(f.name, folder / f"{f.stem}_l{k:03d}{f.suffix}")
        entries += len(originals) * max(copies, 1)
    return entries
