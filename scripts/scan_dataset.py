#!/usr/bin/env python
"""Find the files of an ImageNet-layout folder that would break or bias training; write an exclude list.

Each image is opened and fully decoded with PIL in parallel processes and classified:
  zero-byte, unreadable, truncated, corrupt-headers, not-an-image
                                                  -> excluded (DALI would stop mid-epoch on them)
  wrong-content (e.g. a PNG named .JPEG)          -> reported; DALI decodes by content, kept
  cmyk, grayscale                                 -> reported; DALI converts them to RGB, kept
Writes REPORT.json (every finding) and an exclude list (paths relative to the root) that every
loader honours via `data.exclude_list=PATH`. train.py's own startup check is the fast subset of
this (two small reads per file); run this once on a new dataset for the slow, complete check.

    python scripts/scan_dataset.py /data/imagenet --out imagenet_scan
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from PIL import Image  # noqa: E402
from tqdm import tqdm  # noqa: E402

from dali_train.data.folder import IMAGE_EXTENSIONS, sniff  # noqa: E402

EXCLUDED_KINDS = {"zero-byte", "unreadable", "truncated", "corrupt-headers", "not-an-image"}
EXT_FORMAT = {
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".png": "PNG",
    ".bmp": "BMP",
    ".tif": "TIFF",
    ".tiff": "TIFF",
    ".webp": "WEBP",
}


def classify(path: str) -> list[str]:
    """The findings for one file (empty: a clean RGB image of the format its name says)."""
    quick = sniff(path)
    if quick is not None:
        kind = next((k for k in ("zero-byte", "truncated", "unreadable", "corrupt") if k in quick), "not-an-image")
        return ["corrupt-headers" if kind == "corrupt" else kind]
    try:
        with Image.open(path) as im:
            fmt, mode = im.format, im.mode
            im.load()  # full decode: catches corrupt entropy data the header check cannot see
    except Exception:  # noqa: BLE001 - PIL raises many types for broken files
        return ["truncated"]
    findings = []
    if EXT_FORMAT.get(Path(path).suffix.lower()) != fmt:
        findings.append("wrong-content")
    if mode == "CMYK":
        findings.append("cmyk")
    elif mode in ("L", "LA", "1", "I", "I;16"):
        findings.append("grayscale")
    return findings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="dataset folder with train/<class>/ and val/<class>/")
    ap.add_argument("--out", default="scan", help="output prefix: OUT.json (report) and OUT_exclude.txt")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="decode processes (default: all cores)")
    args = ap.parse_args()
    root = Path(args.root)
    if not root.is_dir():
        sys.exit(f"error: {root}: no such folder")
    files = sorted(str(p) for p in root.glob("*/*/*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        sys.exit(f"error: {root}: no images under <split>/<class>/")
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(tqdm(pool.map(classify, files, chunksize=64), total=len(files), unit="file", disable=None))
    findings = {os.path.relpath(f, root): r for f, r in zip(files, results, strict=True) if r}
    exclude = sorted(f for f, r in findings.items() if EXCLUDED_KINDS & set(r))
    counts = Counter(k for r in findings.values() for k in r)
    Path(f"{args.out}.json").write_text(
        json.dumps({"root": str(root), "files": len(files), "counts": counts, "findings": findings}, indent=1)
    )
    Path(f"{args.out}_exclude.txt").write_text(
        f"# {len(exclude)} undecodable files of {root}, from scripts/scan_dataset.py\n"
        + "".join(f"{f}\n" for f in exclude)
    )
    print(f"{len(files)} files: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "all clean"))
    print(
        f"report: {args.out}.json; exclude list ({len(exclude)} files): {args.out}_exclude.txt "
        f"-> train.py data.exclude_list={args.out}_exclude.txt"
    )


if __name__ == "__main__":
    main()
