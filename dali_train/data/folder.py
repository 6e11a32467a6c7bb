"""An ImageNet-layout folder: `<root>/<split>/<class>/<image>`, listed once, checked before training.

Class indices are the sorted class-folder names of `train/`; `val/` must use a subset of them.
Every loader reads the file list made here, so they share the class mapping, the exclude list and
the pre-flight check. A bad file found here is skipped with a warning; a bad folder stops the run
with a one-line `DatasetError` that names the path.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dali_train.errors import UserError

log = logging.getLogger(__name__)

# Extensions listed as images (case-insensitive). Other files in a class folder (README.txt,
# .DS_Store) are ignored, as torchvision's ImageFolder ignores them.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")

_MAGIC = {  # leading bytes of the formats DALI's decoders read
    b"\xff\xd8\xff": "jpeg",
    b"\x89PNG\r\n\x1a\n": "png",
    b"BM": "bmp",
    b"II*\x00": "tiff",
    b"MM\x00*": "tiff",
    b"RIFF": "webp",
}


class DatasetError(UserError):
    """A problem with the dataset folder that the user must fix; its text is one line."""


@dataclass(frozen=True)
class Split:
    root: Path  # the split folder, e.g. <data.root>/train
    files: list[str]  # absolute paths, sorted by class then name
    labels: list[int]  # class index of each file
    excluded: list[tuple[str, str]]  # (path, reason) of skipped files

    def __len__(self) -> int:
        return len(self.files)


def list_classes(split_dir: Path) -> list[str]:
    """Sorted class-folder names of a split; a `DatasetError` when there are none."""
    if not split_dir.is_dir():
        raise DatasetError(f"{split_dir}: not a folder; data.root must hold train/<class>/ and val/<class>/")
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DatasetError(f"{split_dir}: no class folders; expected {split_dir}/<class>/<image>.JPEG")
    return classes


def sniff(path: str) -> str | None:
    """Why `path` cannot be decoded, or None if its header (and JPEG trailer) look right.

    Two small reads per file: the leading bytes name the format, whatever the extension says
    (a PNG named .JPEG decodes fine); a JPEG must end with the EOI marker, or it is truncated
    (DALI's decoder would stop the whole pipeline on it mid-epoch).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if not head:
                return "zero-byte file"
            kind = next((k for magic, k in _MAGIC.items() if head.startswith(magic)), None)
            if kind is None:
                return "not an image (unknown header)"
            if kind == "jpeg":
                # EOI cannot occur inside entropy-coded data (0xFF is byte-stuffed there), so its
                # presence near the end means the scan finished; some writers pad after it.
                f.seek(max(-1024, -os.fstat(f.fileno()).st_size), os.SEEK_END)
                if b"\xff\xd9" not in f.read():
                    return "truncated JPEG (no end-of-image marker)"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return None


def find_bad_files(files: list[str], threads: int = 32) -> list[tuple[str, str]]:
    """(path, reason) for every file that `sniff` rejects; I/O-bound, so threads in parallel."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        reasons = list(pool.map(sniff, files, chunksize=256))
    return [(f, r) for f, r in zip(files, reasons, strict=True) if r is not None]


def read_exclude_list(path: str) -> set[str]:
    """Paths relative to data.root, one per line; `#` starts a comment."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"data.exclude_list={path}: no such file")
    lines = (line.split("#", 1)[0].strip() for line in p.read_text().splitlines())
    return {line for line in lines if line}


def scan_split(
    root: Path, split: str, class_names: list[str], *, exclude: frozenset[str] = frozenset(), verify: bool = True
) -> Split:
    """List the images of `root/split`, labelled by their index in `class_names`."""
    split_dir = root / split
    classes = list_classes(split_dir)
    unknown = sorted(set(classes) - set(class_names))
    if unknown:
        raise DatasetError(
            f"{split_dir}: class folder(s) {unknown[:3]} not in {root / 'train'}; splits must share classes"
        )
    index = {c: i for i, c in enumerate(class_names)}
    files, labels, excluded = [], [], []
    for c in classes:
        names = sorted(
            e.name for e in os.scandir(split_dir / c) if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not names:
            raise DatasetError(f"{split_dir / c}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})")
        for n in names:
            rel = f"{split}/{c}/{n}"
            if rel in exclude:
                excluded.append((str(split_dir / c / n), "in data.exclude_list"))
                continue
            files.append(str(split_dir / c / n))
            labels.append(index[c])
    if verify:
        bad = find_bad_files(files)
        if bad:
            bad_set = {p for p, _ in bad}
            keep = [(f, lab) for f, lab in zip(files, labels, strict=True) if f not in bad_set]
            files, labels = [f for f, _ in keep], [lab for _, lab in keep]
            excluded.extend(bad)
    if not files:
        raise DatasetError(f"{split_dir}: no readable images left after the checks")
    return Split(split_dir, files, labels, excluded)


@dataclass(frozen=True)
class ImageFolderDataset:
    classes: list[str]
    train: Split
    val: Split

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def scan_dataset(root: str, *, exclude_list: str | None = None, verify: bool = True) -> ImageFolderDataset:
    """List and check both splits of an ImageNet-layout folder; bad files are skipped with a warning."""
    path = Path(root).expanduser()
    if not str(root) or not path.is_dir():
        raise DatasetError(f"data.root={root}: no such folder")
    if not any(path.iterdir()):
        raise DatasetError(f"data.root={root}: the folder is empty; expected train/<class>/ and val/<class>/")
    exclude = frozenset(read_exclude_list(exclude_list)) if exclude_list else frozenset()
    classes = list_classes(path / "train")
    train = scan_split(path, "train", classes, exclude=exclude, verify=verify)
    val = scan_split(path, "val", classes, exclude=exclude, verify=verify)
    for split in (train, val):
        for f, reason in split.excluded[:10]:
            log.warning("skipping %s: %s", f, reason)
        if len(split.excluded) > 10:
            log.warning("... and %d more skipped files in %s", len(split.excluded) - 10, split.root)
    return ImageFolderDataset(classes, train, val)
