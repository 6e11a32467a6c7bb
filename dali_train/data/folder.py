"""An ImageNet-layout folder: `<root>/<split>/<class>/<image>`, listed once, checked before training.

Class indices are the sorted class-folder names of `train/`; `val/` must use a subset of them.
Every loader reads the file list made here, so they share the class mapping, the exclude list and
the pre-flight check. A bad file found here is skipped with a warning; a bad folder stops the run
with a one-line `DatasetError` that names the path.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dali_train.errors import UserError

log = logging.getLogger(__name__)

# Extensions listed as images (case-insensitive). Other files in a class folder (README.txt) and
# dotfiles (.DS_Store, .hidden.JPEG) are ignored.
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


EXCLUDED_BY_LIST = "in data.exclude_list"  # a skipped file's reason

# The fix for a file a loader could not decode mid-run (both loaders say it the same way).
EXCLUDE_HINT = (
    "list it in a file passed as data.exclude_list= (scripts/scan_dataset.py writes one) and resume with trainer.resume="
)


@dataclass(frozen=True)
class Split:
    root: Path  # the split folder, e.g. <data.root>/train
    files: list[str]  # absolute paths, sorted by class then name
    labels: list[int]  # class index of each file
    excluded: list[tuple[str, str]]  # (path, reason) of skipped files

    def __len__(self) -> int:
        return len(self.files)

    def without(self, bad: list[tuple[str, str]]) -> Split:
        """This split minus the (path, reason) files in `bad`, which join `excluded`."""
        bad_here = [(p, r) for p, r in bad if p.startswith(str(self.root) + os.sep)]
        if not bad_here:
            return self
        drop = {p for p, _ in bad_here}
        keep = [(f, lab) for f, lab in zip(self.files, self.labels, strict=True) if f not in drop]
        if not keep:
            raise DatasetError(f"{self.root}: no readable images left after the checks")
        return Split(self.root, [f for f, _ in keep], [lab for _, lab in keep], self.excluded + bad_here)


def list_classes(split_dir: Path) -> list[str]:
    """Sorted class-folder names of a split; a `DatasetError` when there are none."""
    if not split_dir.is_dir():
        raise DatasetError(f"{split_dir}: not a folder; data.root must hold train/<class>/ and val/<class>/")
    try:
        classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:  # unreadable, or a link loop among the class folders
        raise DatasetError(f"{e.filename or split_dir}: {e.strerror}") from None
    if not classes:
        raise DatasetError(f"{split_dir}: no class folders; expected {split_dir}/<class>/<image>.JPEG")
    return classes


def sniff(path: str) -> str | None:
    """Why `path` cannot be decoded, or None if its header (and JPEG trailer) look right.

    A few small reads per file: the leading bytes name the format, whatever the extension says
    (a PNG named .JPEG decodes fine); a JPEG must end with the EOI marker, or it is truncated, and
    its header segments must be well formed; a PNG must end with its IEND chunk and a WebP be as
    long as its RIFF header says (DALI's decoder would stop the whole pipeline on
    either, mid-epoch). Raw `os.pread` from the page cache: 1.28M files take seconds, not minutes.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return "zero-byte file"
        head = os.pread(fd, 12, 0)
        kind = next((k for magic, k in _MAGIC.items() if head.startswith(magic)), None)
        if kind is None or (kind == "webp" and head[8:12] != b"WEBP"):  # RIFF also holds WAV, AVI
            return "not an image (unknown header)"
        if kind == "png" and not _png_has_iend(fd, size):
            return "truncated PNG (no IEND chunk)"
        if kind == "webp" and int.from_bytes(head[4:8], "little") + 8 > size:  # RIFF's own length
            return "truncated WebP (shorter than its RIFF header says)"
        if kind == "jpeg":
            problem, scan_start = _jpeg_headers_problem(fd, size)
            if not _jpeg_has_eoi(fd, size, None if problem else scan_start):
                return "truncated JPEG (no end-of-image marker)"
            return problem
    except OSError as e:
        return f"unreadable ({e.strerror})"
    finally:
        os.close(fd)
    return None


_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC, which end every complete PNG

def _png_has_iend(fd: int, size: int) -> bool:
    """IEND is the last chunk, nearly always in the last bytes; a writer that padded after it would
    otherwise lose a complete image, so without one there the whole file is searched."""
    return _PNG_END in os.pread(fd, min(size, 1024), max(size - 1024, 0)) or _PNG_END in os.pread(fd, size, 0)


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (not DHT/JPG/DAC)


def _jpeg_has_eoi(fd: int, size: int, scan_start: int | None) -> bool:
    """EOI cannot occur inside entropy-coded data (0xFF is byte-stuffed there), so an EOI after the
    start of scan means the scan finished. It is nearly always in the last bytes; some writers pad
    after it or append metadata (camera trailers), so without one there the scan data (from
    `scan_start`; None: headers unreadable) is searched. Never before the scan: an EXIF thumbnail
    (a JPEG inside the headers) has an EOI of its own."""
    tail = max(size - 1024, scan_start or 0)
    if b"\xff\xd9" in os.pread(fd, size - tail, tail):
        return True
    return scan_start is not None and b"\xff\xd9" in os.pread(fd, size - scan_start, scan_start)


def _jpeg_headers_problem(fd: int, size: int) -> tuple[str | None, int]:
    """Walk the marker segments from SOI to the start of scan: each is 0xFF, a marker byte and a
    length. Damaged headers make DALI's decoder stop the pipeline, while damage inside the
    scan data only blurs pixels, so this is the part worth checking. ~10 small reads per file.
    Returns (the problem or None, the start of scan's offset)."""
    head = os.pread(fd, 4096, 0)
    pos, seen_frame = 2, False
    while True:
        seg = head[pos : pos + 4] if pos + 4 <= len(head) else os.pread(fd, 4, pos)
        if len(seg) < 4:
            return "truncated JPEG (headers run past the end of the file)", pos
        if seg[0] != 0xFF:
            return f"corrupt JPEG headers (no marker at byte {pos})", pos
        marker = seg[1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker == 0xDA:  # start of scan: the headers are complete
            return (None if seen_frame else "corrupt JPEG headers (no frame header before the scan)"), pos
        length = int.from_bytes(seg[2:4], "big")
        if length < 2 or pos + 2 + length > size:
            return f"corrupt JPEG headers (bad segment length at byte {pos})", pos
        seen_frame |= marker in _SOF_MARKERS
        pos += 2 + length


def _sniff_chunk(paths: list[str]) -> list[tuple[str, str]]:
    return [(p, r) for p in paths if (r := sniff(p)) is not None]


def find_bad_files(files: list[str], chunk: int = 8192) -> list[tuple[str, str]]:
    """(path, reason) for every file that `sniff` rejects.

    CPU-bound on a warm page cache, so large lists go to forked processes in chunks (a thread pool
    is 10x slower here: per-task overhead under the GIL); small lists stay in this process.
    """
    if len(files) <= 2 * chunk or "fork" not in mp.get_all_start_methods():
        return _sniff_chunk(files)
    chunks = [files[i : i + chunk] for i in range(0, len(files), chunk)]
    workers = min(len(chunks), os.cpu_count() or 1, 16)
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
        return [bad for part in pool.map(_sniff_chunk, chunks) for bad in part]


def list_images(class_dir: Path) -> tuple[list[str], list[str]]:
    """Sorted image names in a class folder, and the paths of image-named symlinks to missing
    files (or to themselves, round a loop). Dotfiles (`.DS_Store`, `._x.JPEG` from macOS,
    `.hidden.JPEG`) are never images."""
    names, dangling = [], []
    try:
        entries = list(os.scandir(class_dir))
    except OSError as e:
        raise DatasetError(f"{class_dir}: {e.strerror}") from None
    for e in entries:
        if e.name.startswith(".") or not e.name.lower().endswith(IMAGE_EXTENSIONS):
            continue
        try:
            regular = e.is_file()
        except OSError:  # a symlink loop (ELOOP): no file behind it, as a dangling link
            regular = False
        if regular:
            names.append(e.name)
        elif e.is_symlink() and not os.path.exists(e.path):
            dangling.append(e.path)
    return sorted(names), sorted(dangling)


def read_exclude_list(path: str, root: Path) -> dict[str, set[str]]:
    """Each entry (a line; one starting with `#` is a comment) -> the root-relative paths it may
    mean: the line itself (file names may hold `#`), the line without a trailing `  # comment`,
    and a path as a loader's error names it (absolute, or with data.root in front, or through the
    root's symlinks), taken relative to `root`. So an error's path can be pasted in as it is."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"data.exclude_list={path}: no such file")
    entries: dict[str, set[str]] = {}
    # File names are bytes: one that is not UTF-8 reads back as the name os.scandir gives it
    for line in p.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        meanings = set()
        for text in {line, re.split(r"\s+#", line, maxsplit=1)[0]}:
            meanings |= {text, os.path.relpath(os.path.abspath(text), os.path.abspath(root))}
            meanings.add(os.path.relpath(os.path.realpath(text), os.path.realpath(root)))
        entries[line] = {m for m in meanings if m.startswith(("train/", "val/"))}
    return entries


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
    files, labels, excluded, dangling = [], [], [], []
    for c in classes:
        names, missing = list_images(split_dir / c)
        dangling += missing
        if not names:
            raise DatasetError(f"{split_dir / c}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})")
        for n in names:
            rel = f"{split}/{c}/{n}"
            if rel in exclude:
                excluded.append((str(split_dir / c / n), EXCLUDED_BY_LIST))
                continue
            files.append(str(split_dir / c / n))
            labels.append(index[c])
    if dangling:  # a link whose target is gone: a lost file the user should know about
        shown = ", ".join(dangling[:10]) + (f" and {len(dangling) - 10} more" if len(dangling) > 10 else "")
        log.warning("skipping %d symlink(s) to missing files (or loops) in %s: %s", len(dangling), split_dir, shown)
    if not files:
        raise DatasetError(f"{split_dir}: every image is in the exclude list")
    split = Split(split_dir, files, labels, excluded)
    return split.without(find_bad_files(files)) if verify else split


@dataclass(frozen=True)
class ImageFolderDataset:
    classes: list[str]
    train: Split
    val: Split

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def without(self, bad: list[tuple[str, str]]) -> ImageFolderDataset:
        return ImageFolderDataset(self.classes, self.train.without(bad), self.val.without(bad))


def scan_dataset(root: str, *, exclude_list: str | None = None, verify: bool = True) -> ImageFolderDataset:
    """List and check both splits of an ImageNet-layout folder; bad files are skipped with a warning."""
    path = Path(root).expanduser()
    if not str(root) or not path.is_dir():
        raise DatasetError(f"data.root={root}: no such folder")
    if not any(path.iterdir()):
        raise DatasetError(f"data.root={root}: the folder is empty; expected train/<class>/ and val/<class>/")
    entries = read_exclude_list(exclude_list, path) if exclude_list else {}
    exclude = frozenset(m for meanings in entries.values() for m in meanings)
    classes = list_classes(path / "train")
    train = scan_split(path, "train", classes, exclude=exclude, verify=verify)
    val = scan_split(path, "val", classes, exclude=exclude, verify=verify)
    listed = {os.path.relpath(f, path) for f, why in train.excluded + val.excluded if why == EXCLUDED_BY_LIST}
    unmatched = sorted(line for line, meanings in entries.items() if not meanings & listed)
    if unmatched:  # a typo here would let the bad file through again: say so
        shown = ", ".join(unmatched[:3]) + (f" and {len(unmatched) - 3} more" if len(unmatched) > 3 else "")
        log.warning("data.exclude_list=%s: %d entries match no file of %s: %s", exclude_list, len(unmatched), path, shown)
    dataset = ImageFolderDataset(classes, train, val)
    if verify:
        warn_excluded(dataset)
    return dataset


def warn_excluded(dataset: ImageFolderDataset) -> None:
    """One warning line per skipped file (the first ten of each split), then a count."""
    for split in (dataset.train, dataset.val):
        for f, reason in split.excluded[:10]:
            log.warning("skipping %s: %s", f, reason)
        if len(split.excluded) > 10:
            log.warning("... and %d more skipped files in %s", len(split.excluded) - 10, split.root)
