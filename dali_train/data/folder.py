"""An ImageNet-layout folder: `<root>/<split>/<class>/<image>`, listed once, checked before training.

Class indices are the sorted class-folder names of `train/`; `val/` must use a subset of them.
Every loader reads the file list made here, so they share the class mapping, the exclude list and
the pre-flight check. A bad file found here is skipped with a warning; a bad folder stops the run
with a one-line `DatasetError` that names the path.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dali_train.data.sniff import find_bad_files
from dali_train.errors import UserError

log = logging.getLogger(__name__)

# Extensions listed as images (case-insensitive). Other files in a class folder (README.txt) and
# dotfiles (.DS_Store, .hidden.JPEG) are ignored.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


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


def list_classes(split_dir: Path, *, warn: bool = True) -> list[str]:
    """Sorted class-folder names of a split; a `DatasetError` when there are none, or when a class
    folder is a symlink to nothing (a disk not mounted here): skipped, its class would be missing
    and every later class's label shifted. Image files beside the class folders are not read: a
    warning counts them (a half-sorted val/ was scored on its sorted part without a word), unless
    not `warn` (a second listing of the split)."""
    if not split_dir.is_dir():
        raise DatasetError(f"{split_dir}: not a folder; data.root must hold train/<class>/ and val/<class>/")
    classes, loose, broken = [], [], []
    try:
        for e in os.scandir(split_dir):
            if e.name.startswith("."):
                continue
            if e.name.lower().endswith(IMAGE_EXTENSIONS) and not _is_dir(e):  # a link to a lost one too
                loose.append(e.name)
            elif e.is_dir():
                classes.append(e.name)
            elif e.is_symlink() and not os.path.exists(e.path):
                broken.append(e.path)
    except OSError as e:  # unreadable, or a link loop among the class folders
        raise DatasetError(f"{e.filename or split_dir}: {e.strerror}") from None
    if broken:
        raise DatasetError(
            f"{sorted(broken)[0]}: a symlink to a missing folder{f' (and {len(broken) - 1} more)' if len(broken) > 1 else ''}"
            f"; its class would be left out and the labels of the classes after it shifted: mount or fix it"
        )
    if not classes:
        raise DatasetError(f"{split_dir}: no class folders; expected {split_dir}/<class>/<image>.JPEG")
    if loose and warn:
        log.warning(
            "%d image file(s) directly in %s are not read, only %s/<class>/ (e.g. %s): sort them into their class folders",
            len(loose), split_dir, split_dir, sorted(loose)[0],
        )  # fmt: skip
    return sorted(classes)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop
        return False


def list_images(class_dir: Path, nested: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Sorted image names in a class folder, and the paths of image-named symlinks to missing
    files (or to themselves, round a loop). Dotfiles (`.DS_Store`, `._x.JPEG` from macOS,
    `.hidden.JPEG`) are never images. Subfolders are not read: their paths go to `nested`."""
    names, dangling = [], []
    try:
        entries = list(os.scandir(class_dir))
    except OSError as e:
        raise DatasetError(f"{class_dir}: {e.strerror}") from None
    if nested is not None:
        nested += sorted(e.path for e in entries if not e.name.startswith(".") and _is_dir(e))
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
    try:  # file names are bytes: one that is not UTF-8 reads back as the name os.scandir gives it
        if not p.is_file():
            raise DatasetError(f"data.exclude_list={path}: {'a folder, not a file' if p.is_dir() else 'no such file'}")
        text = p.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:  # is_file() too: a folder on the way that cannot be searched
        raise DatasetError(f"data.exclude_list={path}: cannot be read ({e.strerror or e})") from None
    entries: dict[str, set[str]] = {}
    for line in text.splitlines():
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
    present = set(classes)
    absent = [c for c in class_names if c not in present]
    if absent:  # allowed (a val set of some classes), but its accuracy is over those only
        log.warning("%s has no folder for %d of the %d classes (%s): they are not in its figures",
                    split_dir, len(absent), len(class_names), ", ".join(absent[:3]) + (", ..." if len(absent) > 3 else ""))  # fmt: skip
    index = {c: i for i, c in enumerate(class_names)}
    files, labels, excluded, dangling, nested = [], [], [], [], []
    for c in classes:
        names, missing = list_images(split_dir / c, nested)
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
    if nested:  # torchvision's ImageFolder reads them; ours would be dropped unseen
        log.warning("%d subfolder(s) of class folders in %s are not read, only <class>/<image> (%s)",
                    len(nested), split_dir, ", ".join(nested[:3]) + (", ..." if len(nested) > 3 else ""))  # fmt: skip
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
    try:  # is_dir() too: a folder on the way that cannot be searched
        if not str(root) or not path.is_dir():
            raise DatasetError(f"data.root={root}: no such folder")
        empty = not any(path.iterdir())
    except OSError as e:
        raise DatasetError(f"data.root={root}: cannot be read ({e.strerror or e})") from None
    if empty:
        raise DatasetError(f"data.root={root}: the folder is empty; expected train/<class>/ and val/<class>/")
    entries = read_exclude_list(exclude_list, path) if exclude_list else {}
    exclude = frozenset(m for meanings in entries.values() for m in meanings)
    classes = list_classes(path / "train", warn=False)  # scan_split lists it again, and warns
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
