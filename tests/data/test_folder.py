"""Folder scanning: class indices, exclude list, and what happens to each kind of bad file (the
pre-flight check of dali_train/data/sniff.py, through scan_dataset's own call of it)."""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from dali_train.data.folder import DatasetError, scan_dataset
from dali_train.data.sample import synthetic_image
from tests.conftest import REPO, launch_env, permissions_hold
from tests.data.damage import damage_huffman_table


def make_tree(root: Path, classes=("a", "b"), per_class=3) -> Path:
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                synthetic_image(0, split, 0, i, 2, 90, 70, 10).save(root / split / c / f"ok{i}.JPEG", quality=90)
    return root


@pytest.fixture
def bad_tree(tmp_path) -> Path:
    """One of each kind of bad file a real crawl of images contains."""
    root = make_tree(tmp_path / "ds")
    img = synthetic_image(0, "train", 1, 9, 2, 90, 70, 10)
    a, b = root / "train" / "a", root / "train" / "b"
    img.convert("CMYK").save(a / "cmyk.JPEG", quality=90)
    img.convert("L").save(a / "gray.JPEG", quality=90)
    img.save(a / "png.JPEG", format="PNG")
    data = (a / "ok0.JPEG").read_bytes()
    (b / "truncated.JPEG").write_bytes(data[: len(data) // 2])
    (b / "zero.JPEG").write_bytes(b"")
    (b / "text.JPEG").write_text("not an image")
    (b / "notes.txt").write_text("ignored: not an image extension")
    (b / "padded.JPEG").write_bytes(data + b"\x00" * 100)  # valid: some writers pad after EOI
    (b / "trailer.JPEG").write_bytes(data + bytes(range(256)) * 16)  # valid: 4 KiB of metadata after EOI
    (b / "headers.JPEG").write_bytes(data[:20] + bytes(180) + data[200:])  # SOI and EOI intact
    (b / "dht.JPEG").write_bytes(damage_huffman_table(data))  # passes the header walk, DALI fails
    # cut 100 bytes into the scan, after an EXIF thumbnail (a JPEG in APP1): the thumbnail's EOI is
    # in the last KiB of the file, but before the scan, so it does not end the image
    thumbnail = io.BytesIO()
    img.resize((8, 8)).save(thumbnail, format="JPEG")
    app1 = b"Exif\x00\x00" + thumbnail.getvalue()
    cut = data[: data.index(b"\xff\xda") + 100]
    (b / "thumbnail.JPEG").write_bytes(cut[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 + cut[2:])
    return root


def test_classes_are_sorted_folder_names_shared_by_both_splits(tmp_path):
    root = make_tree(tmp_path / "ds", classes=("zebra", "apple", "mango"))
    ds = scan_dataset(str(root))
    assert ds.classes == ["apple", "mango", "zebra"]
    assert [Path(f).parent.name for f in ds.val.files] == [ds.classes[i] for i in ds.val.labels]


def test_val_may_lack_a_class_but_keeps_train_indices_and_says_so(tmp_path, caplog):
    root = make_tree(tmp_path / "ds", classes=("a", "b", "c"))
    for f in (root / "val" / "a").iterdir():
        f.unlink()
    (root / "val" / "a").rmdir()
    with caplog.at_level(logging.WARNING, logger="dali_train.data.folder"):
        ds = scan_dataset(str(root))
    assert set(ds.val.labels) == {1, 2}
    assert caplog.messages == [f"{root / 'val'} has no folder for 1 of the 3 classes (a): they are not in its figures"]


def test_a_class_folder_linked_to_a_missing_folder_is_one_line(tmp_path):
    """A per-class link farm onto a disk not mounted here: the class was skipped unseen and the
    labels of the classes after it shifted (a 9-class model of a 10-class set, `completed`)."""
    root = make_tree(tmp_path / "ds", classes=("a", "c"))
    (root / "train" / "b").symlink_to(tmp_path / "unmounted" / "b")
    with pytest.raises(DatasetError) as err:
        scan_dataset(str(root))
    assert str(err.value).startswith(f"{root / 'train' / 'b'}: a symlink to a missing folder")
    assert "\n" not in str(err.value)


def test_images_outside_the_class_folders_are_counted_in_a_warning(tmp_path, caplog):
    """A half-sorted val/ (an interrupted sort) was scored on its sorted part; a class's subfolder
    (which torchvision's ImageFolder reads) was dropped: both unread, both said."""
    root = make_tree(tmp_path / "ds")
    for i in range(2):
        shutil.copy(root / "val" / "a" / "ok0.JPEG", root / "val" / f"ILSVRC2012_val_{i}.JPEG")
    (root / "val" / "ILSVRC2012_val_2.JPEG").symlink_to(tmp_path / "gone.JPEG")  # a lost one: not a class
    (root / "train" / "b" / "more").mkdir()
    shutil.copy(root / "train" / "b" / "ok0.JPEG", root / "train" / "b" / "more" / "x.JPEG")
    with caplog.at_level(logging.WARNING, logger="dali_train.data.folder"):
        ds = scan_dataset(str(root))
    assert len(ds.val.files) == 6 and len(ds.train.files) == 6
    assert caplog.messages == [
        f"1 subfolder(s) of class folders in {root / 'train'} are not read, only <class>/<image> ({root / 'train' / 'b' / 'more'})",
        f"3 image file(s) directly in {root / 'val'} are not read, only {root / 'val'}/<class>/ "
        "(e.g. ILSVRC2012_val_0.JPEG): sort them into their class folders",
    ]


def test_bad_files_are_skipped_with_their_reason_and_the_rest_decodes(bad_tree, caplog):
    ds = scan_dataset(str(bad_tree))
    skipped = {Path(p).name: reason for p, reason in ds.train.excluded}
    assert set(skipped) == {"truncated.JPEG", "zero.JPEG", "text.JPEG", "headers.JPEG", "thumbnail.JPEG"}
    assert "truncated" in skipped["truncated.JPEG"] and "zero-byte" in skipped["zero.JPEG"]
    assert "corrupt JPEG headers" in skipped["headers.JPEG"]
    kept = {Path(f).name for f in ds.train.files}
    assert {"cmyk.JPEG", "gray.JPEG", "png.JPEG", "padded.JPEG", "trailer.JPEG"} <= kept
    assert "notes.txt" not in kept
    assert "truncated.JPEG" in caplog.text  # the warning names the file


def test_cut_png_webp_bmp_and_tiff_files_and_riff_files_of_other_kinds_are_skipped(tmp_path):
    """The formats besides JPEG are checked at their end too: a cut PNG, WebP, BMP or TIFF passed
    the startup check and stopped the run mid-epoch in both loaders; a WAV (also RIFF) passed as a WebP."""
    root = make_tree(tmp_path / "ds")
    a = root / "train" / "a"
    img = synthetic_image(0, "train", 1, 9, 2, 90, 70, 10)
    img.save(a / "ok.png")
    img.save(a / "ok.webp", format="WEBP")
    img.save(a / "ok.bmp")
    img.save(a / "ok.tif")
    img.save(a / "lzw.tif", compression="tiff_lzw")
    png, webp, bmp = ((a / f"ok.{ext}").read_bytes() for ext in ("png", "webp", "bmp"))
    for name in ("ok", "lzw"):
        tif = (a / f"{name}.tif").read_bytes()
        (a / f"cut_{name}.tif").write_bytes(tif[: len(tif) // 2] if name == "ok" else tif[:400] + tif[-300:])
    (a / "cut.bmp").write_bytes(bmp[: len(bmp) // 2])
    (a / "big_claim.bmp").write_bytes(bmp[:2] + (len(bmp) + 2).to_bytes(4, "little") + bmp[6:])  # file-size field off
    (a / "cut.png").write_bytes(png[: len(png) // 2])
    (a / "tail.png").write_bytes(png + bytes(100))  # bytes after IEND: decoders stop at IEND
    (a / "long_tail.png").write_bytes(png + bytes(5000))  # IEND not in the last KiB: still complete
    (a / "cut.webp").write_bytes(webp[: len(webp) // 2])
    (a / "sound.webp").write_bytes(b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + bytes(28))
    ds = scan_dataset(str(root))
    skipped = {Path(p).name: reason for p, reason in ds.train.excluded}
    assert skipped == {
        "cut.png": "truncated PNG (no IEND chunk)",
        "cut.webp": "truncated WebP (shorter than its RIFF header says)",
        "sound.webp": "not an image (unknown header)",
        "cut.bmp": "truncated BMP (shorter than its header says)",
        "cut_ok.tif": "truncated TIFF (its image data runs past the end of the file)",
        "cut_lzw.tif": "truncated TIFF (its image data runs past the end of the file)",
    }
    kept = [f for f in ds.train.files if Path(f).suffix != ".JPEG"]
    assert {Path(f).name for f in kept} == {"ok.png", "ok.webp", "ok.bmp", "big_claim.bmp", "ok.tif", "lzw.tif", "tail.png", "long_tail.png"}
    for f in kept:
        with Image.open(f) as im:
            im.load()


def test_exclude_list_is_honoured(bad_tree, tmp_path, caplog):
    """Relative paths, a `#` inside a file name, a trailing comment, and a path as an error names
    it (absolute, or the real path behind a symlinked data.root) are excluded; an entry that matches
    no file is said."""
    (bad_tree / "train" / "a" / "dht#3.JPEG").write_bytes((bad_tree / "train" / "a" / "ok0.JPEG").read_bytes())
    linked = tmp_path / "linked"
    linked.symlink_to(bad_tree)
    exclude = tmp_path / "exclude.txt"
    exclude.write_text(
        f"# from scan_dataset.py\ntrain/a/cmyk.JPEG\ntrain/a/dht#3.JPEG\n{linked / 'train' / 'b' / 'zero.JPEG'}\n"
        f"train/a/gray.JPEG  # undecodable\n{bad_tree / 'train' / 'b' / 'text.JPEG'}\ntrain/a/typo.JPEG\n"
    )
    ds = scan_dataset(str(linked), exclude_list=str(exclude))
    names = {Path(f).name for f in ds.train.files}
    assert not names & {"cmyk.JPEG", "dht#3.JPEG", "gray.JPEG"} and "ok0.JPEG" in names
    listed = {Path(p).name for p, why in ds.train.excluded if why == "in data.exclude_list"}
    assert {"zero.JPEG", "text.JPEG"} <= listed
    assert "1 entries match no file" in caplog.text and "train/a/typo.JPEG" in caplog.text


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("missing_root", "no such folder"),
        ("empty_root", "empty"),
        ("no_val", "not a folder"),
        ("no_class_folders", "no class folders"),
        ("empty_class", "has no images"),
        ("val_unknown_class", "not in"),
    ],
)
def test_bad_folders_fail_with_one_line_naming_the_path(tmp_path, breakage, message):
    root = tmp_path / "ds"
    if breakage == "empty_root":
        root.mkdir()
    elif breakage != "missing_root":
        make_tree(root)
    if breakage == "no_val":
        os.system(f"rm -r {root / 'val'}")
    elif breakage == "no_class_folders":
        os.system(f"rm -r {root / 'train'}/*")
    elif breakage == "empty_class":
        (root / "train" / "c").mkdir()
    elif breakage == "val_unknown_class":
        (root / "val" / "zzz").mkdir()
        Image.new("RGB", (8, 8)).save(root / "val" / "zzz" / "x.JPEG")
    with pytest.raises(DatasetError) as err:
        scan_dataset(str(root))
    text = str(err.value)
    assert message in text and "\n" not in text
    assert str(tmp_path) in text


def test_dotfiles_are_skipped_and_a_dangling_symlink_is_named_in_one_warning(tmp_path, caplog):
    root = make_tree(tmp_path / "ds")
    a = root / "train" / "a"
    good = (a / "ok0.JPEG").read_bytes()
    (a / ".hidden.JPEG").write_bytes(good)  # a valid image, but a dotfile
    (a / "._ok1.JPEG").write_bytes(b"\x00\x05\x16\x07")  # macOS resource fork next to ok1.JPEG
    (a / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (a / "linked.JPEG").symlink_to(a / "ok1.JPEG")  # a working link is an image like any other
    (a / "gone.JPEG").symlink_to(tmp_path / "elsewhere" / "gone.JPEG")
    (root / "val" / "b" / "gone_too.JPEG").symlink_to(tmp_path / "nowhere.JPEG")
    (a / "loop.JPEG").symlink_to(a / "loop.JPEG")  # a link to itself: is_file() raised ELOOP
    ds = scan_dataset(str(root))
    names = {Path(f).name for f in ds.train.files + ds.val.files}
    assert not {n for n in names if n.startswith(".")}
    assert "linked.JPEG" in names and "gone.JPEG" not in names and len(ds.train.files) == 7
    warnings = [r.getMessage() for r in caplog.records if "symlink" in r.getMessage()]
    assert len(warnings) == 2  # one line per split, naming every dangling link
    assert str(a / "gone.JPEG") in warnings[0] and str(root / "val" / "b" / "gone_too.JPEG") in warnings[1]
    assert str(a / "loop.JPEG") in warnings[0]


def test_an_exclude_list_names_files_whose_names_are_not_utf8(tmp_path, caplog):
    """A Latin-1 file name (bytes that are no UTF-8) listed in a Latin-1 exclude list, as
    scan_dataset.py writes one: the name matches, where reading the list raised UnicodeDecodeError."""
    caplog.set_level(logging.ERROR, logger="dali_train")  # pytest-xdist cannot send a captured surrogate
    root = make_tree(tmp_path / "ds")
    name = os.fsdecode(b"caf\xe9.JPEG")
    (root / "train" / "a" / name).write_bytes((root / "train" / "a" / "ok0.JPEG").read_bytes())
    exclude = tmp_path / "exclude.txt"
    exclude.write_bytes(b"train/a/caf\xe9.JPEG\n")
    ds = scan_dataset(str(root), exclude_list=str(exclude))
    assert [Path(p).name for p, _ in ds.train.excluded] == [name]
    assert name not in {Path(f).name for f in ds.train.files}


def test_an_exclude_list_that_empties_a_split_is_one_line(tmp_path):
    root = make_tree(tmp_path / "ds")
    exclude = tmp_path / "exclude.txt"
    exclude.write_text("".join(f"{p.relative_to(root)}\n" for p in sorted((root / "train").rglob("*.JPEG"))))
    with pytest.raises(DatasetError, match=r"/train: every image is in the exclude list$"):
        scan_dataset(str(root), exclude_list=str(exclude))


@pytest.mark.parametrize("locked", ["itself", "its folder"])
@pytest.mark.parametrize("key", ["root", "exclude_list"])
def test_a_data_path_that_cannot_be_read_is_one_line_naming_its_option(small_root, tmp_path, key, locked):
    """It was a PermissionError traceback (the listing of the classes already said it in one line)."""
    root, exclude = tmp_path / "a" / "data", tmp_path / "b" / "exclude.txt"
    shutil.copytree(small_root, root)
    exclude.parent.mkdir()
    exclude.write_text("train/none.JPEG\n")
    path = root if key == "root" else exclude
    (path if locked == "itself" else path.parent).chmod(0)
    scan = (
        "import sys; from dali_train.data.folder import DatasetError, scan_dataset\n"
        "try: scan_dataset(sys.argv[1], exclude_list=sys.argv[2], verify=False)\n"
        "except DatasetError as e: print(f'error: {e}')"
    )
    cmd = [*permissions_hold(), sys.executable, "-c", scan, str(root), str(exclude)]
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=120)
    value = root if key == "root" else exclude
    assert proc.stdout.strip() == f"error: data.{key}={value}: cannot be read (Permission denied)", proc.stderr[-2000:]


def test_a_folder_given_as_the_exclude_list_is_named_as_one(small_root, tmp_path):
    with pytest.raises(DatasetError, match="data.exclude_list=.*: a folder, not a file"):
        scan_dataset(str(small_root), exclude_list=str(tmp_path), verify=False)
