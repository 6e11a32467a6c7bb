#!/usr/bin/env python
"""Find the files of an ImageNet-layout folder that would break or bias training; write an exclude list.

Each image is fully decoded twice in parallel processes, by PIL and by DALI's CPU decoder (libjpeg-
turbo, as in training), and classified:
  zero-byte, unreadable, truncated, corrupt-headers, not-an-image, undecodable
                                                  -> excluded (DALI would stop the run on them)
  corrupt-data (the decoder warned, e.g. "Corrupt JPEG data: premature end of data segment":
  damaged scan data that DALI decodes to wrong pixels without naming the file)
                                                  -> excluded
  wrong-content (e.g. a PNG named .JPEG)          -> reported; DALI decodes by content, kept
  cmyk, grayscale                                 -> reported; DALI converts them to RGB, kept
  dangling-symlink                                -> reported; the loaders skip it with a warning
Not caught: damage that still decodes without a decoder warning (the bytes happen to form valid
codes); no decoder can tell those pixels from real ones. Writes OUT.json (every finding, with the
decoder's message for corrupt-data) and an exclude list (paths relative to the root) that every
loader honours via `data.exclude_list=PATH`. train.py's own startup check is the fast subset of
this (a few small reads per file); run this once on a new dataset for the slow, complete check.

    python scripts/scan_dataset.py /data/imagenet --out imagenet_scan
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from dali_train.cli import at_least
from dali_train.data.dali_graph import decode_one_pipeline
from dali_train.data.folder import list_images
from dali_train.data.sniff import sniff

EXCLUDED_KINDS = {"zero-byte", "unreadable", "truncated", "corrupt-headers", "not-an-image", "undecodable", "corrupt-data"}
EXT_FORMAT = {
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".png": "PNG",
    ".bmp": "BMP",
    ".tif": "TIFF",
    ".tiff": "TIFF",
    ".webp": "WEBP",
}


class DaliDecoder:
    """One file at a time through DALI's CPU decoder, with what the decoder prints to stderr.

    libjpeg-turbo reports damaged scan data only as a warning printed to stderr, and neither DALI,
    PIL nor torchvision exposes it; a synchronous batch-of-one pipeline ties each message to its file.
    """

    def __init__(self) -> None:
        self.pipe = None
        self.stderr = tempfile.TemporaryFile()

    def decode(self, path: str) -> tuple[bool, str]:
        """(decoded, the decoder's messages on one line)."""
        self.pipe = self.pipe or decode_one_pipeline()
        self.pipe.feed_input("encoded", [np.fromfile(path, dtype=np.uint8)])
        self.stderr.seek(0)
        self.stderr.truncate()
        saved = os.dup(2)
        os.dup2(self.stderr.fileno(), 2)
        try:
            self.pipe.run()
            ok = True
        except RuntimeError:
            ok, self.pipe = False, None  # a pipeline that failed cannot run again
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        self.stderr.seek(0)
        return ok, " | ".join(self.stderr.read().decode(errors="replace").split("\n")).strip(" |")


_decoder: DaliDecoder | None = None  # one per worker process


def classify(path: str) -> tuple[list[str], str]:
    """The findings for one file (empty: a clean RGB image of the format its name says), and the
    decoder's message for corrupt-data."""
    global _decoder
    quick = sniff(path)
    if quick is not None:
        kind = next((k for k in ("zero-byte", "truncated", "unreadable", "corrupt") if k in quick), "not-an-image")
        return ["corrupt-headers" if kind == "corrupt" else kind], ""
    try:
        with Image.open(path) as im:
            fmt, mode = im.format, im.mode
            im.load()  # full decode: catches some corrupt entropy data the header check cannot see
    except Exception:  # noqa: BLE001 - PIL raises many types for broken files
        return ["undecodable"], ""
    _decoder = _decoder or DaliDecoder()
    ok, message = _decoder.decode(path)
    if not ok:
        return ["undecodable"], message
    findings = ["corrupt-data"] if message and fmt == "JPEG" else []
    if EXT_FORMAT.get(Path(path).suffix.lower()) != fmt:
        findings.append("wrong-content")
    if mode == "CMYK":
        findings.append("cmyk")
    elif mode in ("L", "LA", "1", "I", "I;16"):
        findings.append("grayscale")
    return findings, message if "corrupt-data" in findings else ""


def list_files(root: Path) -> tuple[list[str], list[str]]:
    """Images under <split>/<class>/ as the loaders list them (no dotfiles), and dangling symlinks."""
    files, dangling = [], []
    for class_dir in sorted(root.glob("*/*")):
        if class_dir.is_dir() and not class_dir.name.startswith(".") and not class_dir.parent.name.startswith("."):
            names, missing = list_images(class_dir)
            files += [str(class_dir / n) for n in names]
            dangling += missing
    return files, dangling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="dataset folder with train/<class>/ and val/<class>/")
    ap.add_argument("--out", default="scan", help="output prefix: OUT.json (report) and OUT_exclude.txt")
    ap.add_argument("--workers", type=at_least(1), default=os.cpu_count(), help="decode processes (default: all cores)")
    args = ap.parse_args()
    root = Path(args.root)
    if not root.is_dir():
        sys.exit(f"error: {root}: no such folder")
    if not Path(args.out).resolve().parent.is_dir():  # checked before the decode pass, not after it
        sys.exit(f"error: --out {args.out}: no folder {Path(args.out).parent} to write its report in")
    files, dangling = list_files(root)
    if not files:
        sys.exit(f"error: {root}: no images under <split>/<class>/")
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(tqdm(pool.map(classify, files, chunksize=64), total=len(files), unit="file", disable=None))
    findings = {os.path.relpath(f, root): kinds for f, (kinds, _) in zip(files, results, strict=True) if kinds}
    findings.update({os.path.relpath(f, root): ["dangling-symlink"] for f in dangling})
    messages = {os.path.relpath(f, root): m for f, (_, m) in zip(files, results, strict=True) if m}
    exclude = sorted(f for f, r in findings.items() if EXCLUDED_KINDS & set(r))
    counts = Counter(k for r in findings.values() for k in r)
    report = {"root": str(root), "files": len(files), "counts": counts, "findings": findings, "messages": messages}
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=1))
    Path(f"{args.out}_exclude.txt").write_text(
        f"# {len(exclude)} undecodable files of {root}, from scripts/scan_dataset.py\n"
        + "".join(f"{f}\n" for f in exclude),
        encoding="utf-8",
        errors="surrogateescape",  # a name that is not UTF-8 is written as its bytes, as read_exclude_list reads it
    )
    print(f"{len(files)} files: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "all clean"))
    print(
        f"report: {args.out}.json; exclude list ({len(exclude)} files): {args.out}_exclude.txt "
        f"-> train.py data.exclude_list={args.out}_exclude.txt"
    )


if __name__ == "__main__":
    main()
