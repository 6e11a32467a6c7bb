"""The dataset tools in scripts/, run as users run them, on small real JPEG folders: in this process
as the interpreter runs a script (conftest.run_script), or as a subprocess where the script forks
workers that decode with DALI (scan_dataset.py) or measures its own process (measure_startup.py)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
from PIL import Image

from dali_train.data.folder import scan_dataset
from dali_train.data.sample import synthetic_image
from tests.conftest import REPO, run_script
from tests.data.damage import damage_scan_data
from tests.data.test_folder import bad_tree, make_tree  # noqa: F401 - fixture reused
from tests.data.test_loaders import SMALL, loaders

SCRIPTS = [
    "make_synthetic_imagenet.py",
    "scan_dataset.py",
    "resize_dataset.py",
    "prepare_imagenet_val.py",
    "benchmark.py",
    "sweep_summary.py",
    "sweep_torchrun.py",
    "estimate_time.py",
    "measure_startup.py",
    "profile_summary.py",
]


def script(name: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    """`python scripts/NAME ARGS` as a subprocess."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # this checkout's package, installed or not
    )
    if check and proc.returncode:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_has_help(name, capfd):
    """`python scripts/NAME --help`: argparse's usage, exit code 0."""
    proc = run_script(f"scripts/{name}", "--help", capfd=capfd)
    assert proc.returncode == 0 and "usage:" in proc.stdout


def test_make_synthetic_imagenet_is_deterministic_and_realistic(tmp_path, capfd):
    for out in ("a", "b"):
        run_script(
            "scripts/make_synthetic_imagenet.py",
            "--out",
            tmp_path / out,
            "--classes",
            3,
            "--train-per-class",
            2,
            "--val-per-class",
            1,
            "--workers",
            2,
            capfd=capfd,
        )
    files = sorted((tmp_path / "a").rglob("*.JPEG"))
    assert len(files) == 9
    assert all(f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes() for f in files)
    with Image.open(files[0]) as im:
        assert im.size == (500, 375)
    assert 70_000 < sum(f.stat().st_size for f in files) / len(files) < 160_000
    assert run_script("scripts/make_synthetic_imagenet.py", "--out", tmp_path / "a", capfd=capfd, check=False).returncode != 0


@pytest.mark.slow
def test_scan_dataset_classifies_bad_files_and_its_exclude_list_works(bad_tree, tmp_path):  # noqa: F811
    out = tmp_path / "scan"
    latin1 = os.fsdecode(b"z\xe9ro.JPEG")  # a name that is not UTF-8: the exclude list must still hold it
    (bad_tree / "train" / "b" / latin1).write_bytes(b"")
    script("scan_dataset.py", bad_tree, "--out", out, "--workers", 2)
    report = json.loads(Path(f"{out}.json").read_text())["findings"]
    assert report["train/b/zero.JPEG"] == ["zero-byte"] and report["train/b/truncated.JPEG"] == ["truncated"]
    assert report["train/b/text.JPEG"] == ["not-an-image"] and report["train/a/cmyk.JPEG"] == ["cmyk"]
    assert report["train/b/headers.JPEG"] == ["corrupt-headers"]
    assert report["train/a/gray.JPEG"] == ["grayscale"] and report["train/a/png.JPEG"] == ["wrong-content"]
    assert report["train/b/dht.JPEG"] == ["undecodable"]  # passes train.py's startup check, not DALI
    assert not {f for f in report if "/ok" in f or "padded" in f}  # no finding on clean files
    exclude = Path(f"{out}_exclude.txt").read_text(errors="surrogateescape")
    assert "train/b/zero.JPEG" in exclude and "train/a/cmyk.JPEG" not in exclude
    ds = scan_dataset(str(bad_tree), exclude_list=f"{out}_exclude.txt", verify=False)
    names = {Path(f).name for f in ds.train.files}
    assert not names & {"zero.JPEG", "truncated.JPEG", "text.JPEG", "headers.JPEG", "dht.JPEG", latin1}
    assert "cmyk.JPEG" in names


@pytest.mark.slow
def test_scan_dataset_reports_damaged_scan_data_that_dali_decodes_with_an_anonymous_warning(tmp_path, capfd):
    """Damage inside the entropy-coded data: headers and end marker intact, so train.py's startup
    check passes and DALI decodes the file, printing "Corrupt JPEG data" without a file name. The
    scan names those files; with its exclude list DALI reads the folder without that warning."""
    root = make_tree(tmp_path / "ds")
    val = root / "val" / "a"
    synthetic_image(0, "val", 0, 9, 2, 320, 240, 10).save(val / "big.JPEG", quality=90)
    data = (val / "big.JPEG").read_bytes()
    (val / "cut.JPEG").write_bytes(data[: len(data) // 2] + b"\xff\xd9")  # half written, end marker appended
    damaged = [f"val/a/scan{i}.JPEG" for i in range(8)]
    for i, rel in enumerate(damaged):
        (root / rel).write_bytes(damage_scan_data(data, seed=i))

    capfd.readouterr()
    list(loaders(root, "loader=dali_cpu", *SMALL).val)
    assert "Corrupt JPEG data" in capfd.readouterr().err  # what a run shows today: no file named

    out = tmp_path / "scan"
    script("scan_dataset.py", root, "--out", out, "--workers", 2)
    report = json.loads(Path(f"{out}.json").read_text())
    findings, messages = report["findings"], report["messages"]
    assert findings["val/a/cut.JPEG"] == ["corrupt-data"] and "premature end" in messages["val/a/cut.JPEG"]
    flagged = [rel for rel in damaged if rel in findings]
    # corrupt-data: DALI's decoder warned; undecodable: PIL's stricter decode gave up (DALI did not).
    assert all(findings[rel] in (["corrupt-data"], ["undecodable"]) for rel in flagged)
    assert all("Corrupt JPEG data" in messages[rel] for rel in flagged if findings[rel] == ["corrupt-data"])
    assert len(flagged) >= len(damaged) // 2  # the rest decode without any warning: see the README
    assert set(findings) == {"val/a/cut.JPEG", *flagged}  # nothing on the clean files

    capfd.readouterr()
    list(loaders(root, "loader=dali_cpu", *SMALL, f"data.exclude_list={out}_exclude.txt").val)
    assert "Corrupt JPEG data" not in capfd.readouterr().err


def test_resize_dataset_keeps_layout_and_caps_the_side(tmp_path):
    src = tmp_path / "src"
    for split in ("train", "val"):
        (src / split / "c").mkdir(parents=True)
        synthetic_image(0, split, 0, 0, 2, 400, 300, 5).save(src / split / "c" / "x.JPEG")
    Image.new("RGB", (50, 40)).save(src / "train" / "c" / "small.png")
    synthetic_image(0, "train", 0, 1, 2, 100, 80, 5).save(src / "train" / "c" / "small.JPEG")
    script("resize_dataset.py", src, tmp_path / "dst", "--max-side", 128, "--workers", 2)
    with Image.open(tmp_path / "dst" / "train" / "c" / "x.JPEG") as im:
        assert im.size == (128, 96) and im.format == "JPEG"
    with Image.open(tmp_path / "dst" / "train" / "c" / "small.png") as im:
        assert im.size == (50, 40) and im.format == "JPEG"
    # a JPEG already within the side is copied, not re-encoded (no second generation of loss)
    assert (tmp_path / "dst" / "train" / "c" / "small.JPEG").read_bytes() == (src / "train" / "c" / "small.JPEG").read_bytes()
    assert (tmp_path / "dst" / "val" / "c" / "x.JPEG").is_file()
    # a rerun keeps what is there and says so (it reported every image as resized); in place is refused
    again = script("resize_dataset.py", src, tmp_path / "dst", "--max-side", 64, "--workers", 2).stdout
    assert "0 images written" in again and "4 already there, kept as they are" in again, again
    same = script("resize_dataset.py", src, src / "train", "--max-side", 64, check=False)
    assert same.returncode == 1 and "must be a folder outside" in same.stderr, same.stderr


def test_resize_dataset_can_cap_the_shorter_side_as_fastais_copies(tmp_path):
    """fastai's 160 px Imagenette/Imagewoof: the shorter side at 160, aspect kept (a portrait image too)."""
    src = tmp_path / "src" / "train" / "c"
    src.mkdir(parents=True)
    synthetic_image(0, "train", 0, 0, 2, 400, 300, 5).save(src / "wide.JPEG")
    synthetic_image(0, "train", 0, 1, 2, 300, 500, 5).save(src / "tall.JPEG")
    script("resize_dataset.py", tmp_path / "src", tmp_path / "dst", "--shorter-side", 150, "--workers", 1)
    sizes = {p.name: Image.open(p).size for p in (tmp_path / "dst" / "train" / "c").iterdir()}
    assert sizes == {"wide.JPEG": (200, 150), "tall.JPEG": (150, 250)}, sizes
    (src / "._wide.JPEG").write_bytes(b"\x00\x05\x16\x07 macOS resource fork")  # what a copy from a Mac leaves
    again = script("resize_dataset.py", tmp_path / "src", tmp_path / "dst", "--shorter-side", 150, "--workers", 1)
    assert "0 skipped" in again.stdout and not (tmp_path / "dst" / "train" / "c" / "._wide.JPEG").exists(), again.stdout
    both = script("resize_dataset.py", tmp_path / "src", tmp_path / "d2", "--shorter-side", 9, "--max-side", 9, check=False)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr


def test_resize_dataset_scales_16_bit_grayscale_to_8_bits(tmp_path):
    """PIL's convert("RGB") clips a 16-bit image at 255: a gradient over the 16-bit range came out
    white (mean 254.5), where DALI decodes it to its 8-bit levels (mean 127.5)."""
    src = tmp_path / "src" / "train" / "c"
    src.mkdir(parents=True)
    gradient = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (32, 1))
    Image.fromarray(gradient).save(src / "deep.png")
    script("resize_dataset.py", tmp_path / "src", tmp_path / "dst", "--max-side", 64, "--workers", 1)
    with Image.open(tmp_path / "dst" / "train" / "c" / "deep.png") as im:
        assert im.format == "JPEG" and im.mode == "RGB"
        assert np.asarray(im).mean() == pytest.approx(127.5, abs=2)


@pytest.mark.parametrize(
    "flag, value, message",
    [("--max-side", 0, "argument --max-side: 0: must be 1 or more"),
     ("--workers", 0, "argument --workers: 0: must be 1 or more"),
     ("--quality", 101, "argument --quality: 101: must be 1 or more and 100 or less")],
)  # fmt: skip
def test_resize_dataset_refuses_a_setting_that_would_write_wrong_images(tmp_path, flag, value, message):
    """--max-side 0 or below wrote every image as 1x1 px and reported success; --workers 0 was a traceback."""
    src = tmp_path / "src" / "train" / "c"
    src.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(src / "x.JPEG")
    proc = script("resize_dataset.py", tmp_path / "src", tmp_path / "dst", flag, value, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(f"error: {message}") and not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("make_synthetic_imagenet.py", ["--val-per-class", "-3"], "argument --val-per-class: -3: must be 1 or more"),
        ("estimate_time.py", ["imagenet_rn50_90ep", "--img-s", "1000", "--gpus", "0"], "argument --gpus: 0: must be 1"),
        ("estimate_time.py", ["imagenet_rn50_90ep", "--img-s", "-3000"], "argument --img-s: -3000: must be above 0"),
        ("scan_dataset.py", [".", "--workers", "0"], "argument --workers: 0: must be 1 or more"),
        ("measure_startup.py", ["--root", "FARM", "--json", "/nonexistent/x.json"], "--json /nonexistent/x.json: no folder"),
    ],
)
def test_a_count_out_of_range_is_argparses_error_line_before_any_work(tmp_path, name, argv, message, capfd):
    """Zero or negative counts and sizes were tracebacks (some after minutes of work), empty folders,
    or negative times and sizes printed as results. In this process: argparse ends it before any work
    (a subprocess paid ~2 s of imports each for that)."""
    extra = ["--out", tmp_path / "out"] if name == "make_synthetic_imagenet.py" else []
    argv = [str(tmp_path / "out") if a == "FARM" else a for a in argv]  # where the farm would have been made
    proc = run_script(f"scripts/{name}", *argv, *extra, capfd=capfd, check=False)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_prepare_imagenet_val_from_csv_and_from_devkit_ids(tmp_path):
    for form in ("csv", "ids"):
        val = tmp_path / form / "val"
        val.mkdir(parents=True)
        names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 5)]
        for n in names:
            Image.new("RGB", (8, 8)).save(val / n)
        wnids = ["n01440764", "n01443537", "n01440764", "n01484850"]
        if form == "csv":
            labels = tmp_path / form / "LOC_val_solution.csv"
            labels.write_text(
                "ImageId,PredictionString\n"
                + "".join(f"{Path(n).stem},{w} 1 2 3 4\n" for n, w in zip(names, wnids, strict=True))
            )
            extra = []
        else:
            labels, synsets = tmp_path / form / "gt.txt", tmp_path / form / "synsets.txt"
            synsets.write_text("n01440764\nn01443537\nn01484850\n")
            labels.write_text("1\n2\n1\n3\n")
            extra = ["--synsets", synsets]
        dry = script("prepare_imagenet_val.py", val, "--labels", labels, *extra, "--dry-run")
        assert "dry run" in dry.stdout and len(list(val.glob("*.JPEG"))) == 4
        (val / "n01440764").mkdir()  # as a run interrupted after its first move leaves the folder
        (val / names[0]).rename(val / "n01440764" / names[0])
        script("prepare_imagenet_val.py", val, "--labels", labels, *extra)  # resumes (the ID list did not)
        assert sorted(p.name for p in val.iterdir()) == ["n01440764", "n01443537", "n01484850"]
        assert len(list((val / "n01440764").iterdir())) == 2
    bad = script("prepare_imagenet_val.py", tmp_path / "nope", "--labels", labels, check=False)
    assert bad.returncode != 0 and "no such folder" in bad.stderr
    shutil.rmtree(tmp_path / "csv")


@pytest.mark.parametrize(
    "ids, synsets, message",
    [
        ("0\n1\n0\n2\n", "n01\nn02\nn03\n", "class IDs start at 1 (the devkit's), this list has 0"),  # shifted silently
        ("n01 1\n", "n01\nn02\n", "expected one class ID (1..2) per line, found 'n01'"),  # Caffe's val.txt
        ("", "n01\n", "expected one class ID (1..1) per line, found none"),
        ("1\n", None, "--synsets"),  # a path that is not there
    ],
)
def test_prepare_imagenet_val_refuses_an_id_list_it_would_misread_in_one_line(tmp_path, ids, synsets, message):
    val = tmp_path / "val"
    val.mkdir()
    for i in range(1, 5):
        Image.new("RGB", (8, 8)).save(val / f"ILSVRC2012_val_{i:08d}.JPEG")
    (tmp_path / "gt.txt").write_text(ids)
    if synsets is not None:
        (tmp_path / "synsets.txt").write_text(synsets)
    proc = script(
        "prepare_imagenet_val.py", val, "--labels", tmp_path / "gt.txt", "--synsets", tmp_path / "synsets.txt", check=False
    )
    assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in val.iterdir()) == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 5)]


def test_prepare_imagenet_val_refuses_alphabetical_synsets_that_would_mislabel_every_image(tmp_path):
    """The devkit's ground truth for val 1..5 (490, 361, 171, 822, 297) with an alphabetical wnid list
    (timm's imagenet_synsets.txt, as LOC_synset_mapping.txt) put val 1, a sea snake (n01751748 in
    Kaggle's CSV), into n03000134, and the other four into wrong classes too, silently."""
    val = tmp_path / "val"
    val.mkdir()
    for i in range(1, 6):
        Image.new("RGB", (8, 8)).save(val / f"ILSVRC2012_val_{i:08d}.JPEG")
    (tmp_path / "gt.txt").write_text("490\n361\n171\n822\n297\n")
    alphabetical = (Path(timm.__file__).parent / "data" / "_info" / "imagenet_synsets.txt").read_text().split()
    assert len(alphabetical) == 1000 and alphabetical == sorted(alphabetical)
    synsets = tmp_path / "synsets.txt"
    for wnids, message in [
        (alphabetical, "alphabetical, not the devkit's ILSVRC2012_ID order"),
        (alphabetical[:2] + alphabetical[:1], "n01440764 is listed 2 times"),
    ]:
        synsets.write_text("\n".join(wnids) + "\n")
        proc = script("prepare_imagenet_val.py", val, "--labels", tmp_path / "gt.txt", "--synsets", synsets, check=False)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert len(list(val.glob("*.JPEG"))) == 5  # nothing moved
    synsets.write_text("\n".join(alphabetical[1:2] + alphabetical[:1] + alphabetical[2:]) + "\n")  # not alphabetical
    script("prepare_imagenet_val.py", val, "--labels", tmp_path / "gt.txt", "--synsets", synsets)
    assert (val / alphabetical[489] / "ILSVRC2012_val_00000001.JPEG").is_file()


def test_prepare_imagenet_val_refuses_a_csv_row_without_a_class(tmp_path):
    val = tmp_path / "val"
    val.mkdir()
    Image.new("RGB", (8, 8)).save(val / "ILSVRC2012_val_00000001.JPEG")
    (tmp_path / "sol.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,\n")
    proc = script("prepare_imagenet_val.py", val, "--labels", tmp_path / "sol.csv", check=False)
    assert proc.returncode == 1 and "line 2 (ILSVRC2012_val_00000001) has no class" in proc.stderr, proc.stderr


def test_prepare_imagenet_val_takes_excels_csv_and_a_macs_folder_and_refuses_binary_labels(tmp_path):
    """A CSV with a byte-order mark was refused as lacking its columns; a macOS ._ file counted as an
    image without a label; labels that are not UTF-8 were a traceback."""
    val = tmp_path / "val"
    val.mkdir()
    Image.new("RGB", (8, 8)).save(val / "ILSVRC2012_val_00000001.JPEG")
    (val / "._ILSVRC2012_val_00000001.JPEG").write_bytes(b"\x00\x05\x16\x07 resource fork")
    sol = tmp_path / "sol.csv"
    sol.write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n", encoding="utf-8-sig")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00I\x00m\x80\x81")
    bad = script("prepare_imagenet_val.py", val, "--labels", binary, check=False)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error: --labels") and "not UTF-8" in bad.stderr, bad.stderr
    script("prepare_imagenet_val.py", val, "--labels", sol)
    assert (val / "n01440764" / "ILSVRC2012_val_00000001.JPEG").is_file()
    assert (val / "._ILSVRC2012_val_00000001.JPEG").is_file()  # left where it was


def test_prepare_imagenet_val_copy_cut_short_is_one_line_and_the_rerun_redoes_that_file(tmp_path):
    """A copy cut short (here by a file-size limit: EFBIG, as a full disk gives ENOSPC) left a
    truncated target, which the rerun took as done: a val image that cannot be decoded."""
    val = tmp_path / "val"
    val.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 4):  # ~190 KB of noise each, over the 100 KiB limit
        Image.fromarray(rng.integers(0, 255, (400, 400, 3), dtype=np.uint8)).save(
            val / f"ILSVRC2012_val_{i:08d}.JPEG", quality=95
        )
    (tmp_path / "gt.txt").write_text("1\n2\n1\n")
    (tmp_path / "synsets.txt").write_text("n01440764\nn01443537\n")
    args = [REPO / "scripts" / "prepare_imagenet_val.py", val, "--labels", tmp_path / "gt.txt"]
    args += ["--synsets", tmp_path / "synsets.txt", "--copy"]
    cut = subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, resource.RLIM_INFINITY)),
    )
    assert cut.returncode == 1 and cut.stderr.startswith("error: ") and "Traceback" not in cut.stderr, cut.stderr
    assert "ILSVRC2012_val_00000001.JPEG" in cut.stderr and len(cut.stderr.strip().splitlines()) == 1
    assert not list(val.glob("n*/ILSVRC*"))  # nothing under a real name
    script("prepare_imagenet_val.py", *args[1:])  # the rerun, no limit
    for f in sorted(val.glob("*.JPEG")):
        copied = next(val.glob(f"n*/{f.name}"))
        assert copied.read_bytes() == f.read_bytes(), copied
    assert sorted(p.name for p in val.glob("n*/*")) == sorted(p.name for p in val.glob("*.JPEG"))  # no temp file shows


def test_benchmark_cpu_smoke(sample_root, tmp_path, capfd):
    """The benchmark's tiny CPU mode: dali_cpu and synthetic batches, a few steps, all outputs."""
    out = tmp_path / "bench"
    proc = run_script(
        "scripts/benchmark.py",
        "--modes",
        "loader",
        "model",
        "e2e",
        "--loaders",
        "dali_cpu",
        "--models",
        "resnet18",
        "--steps",
        2,
        "--warmup",
        1,
        "--repeats",
        1,
        "--out",
        out,
        "--loader-set",
        "dali_cpu:loader.num_threads=2",  # a key of the DALI loaders only: set per loader
        "--",
        "trainer.device=cpu",
        "data=imagenet",
        f"data.root={sample_root}",
        "data.train_size=32",
        "loader.batch_size=8",
        capfd=capfd,
    )
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["mode"], r["loader"]) for r in rows] == [
        ("loader", "dali_cpu"),
        ("model", "synthetic"),
        ("e2e", "dali_cpu"),
    ]
    assert all(r["img_s"] > 0 and 0 <= r["data_wait_frac"] <= 1 for r in rows)
    assert "e2e dali_cpu ÷ model-only" in proc.stdout and (out / "results.md").is_file()


def test_split_holdout_takes_a_seeded_share_of_each_class_and_never_val(sample_root, tmp_path, capfd):
    dst = tmp_path / "holdout"
    run_script("scripts/split_holdout.py", sample_root, dst, "--fraction", "0.25", capfd=capfd)
    train = {p.name: p.resolve() for p in dst.glob("train/*/*")}
    held = {p.name: p.resolve() for p in dst.glob("val/*/*")}
    assert len(train) == 300 and len(held) == 100 and not set(train) & set(held)  # 40 per class: 30 + 10
    assert all(p.parent.parent == (sample_root / "train").resolve() for p in [*train.values(), *held.values()])
    for cls in (sample_root / "train").iterdir():
        assert len(list((dst / "val" / cls.name).iterdir())) == 10
    again = run_script("scripts/split_holdout.py", sample_root, dst, capfd=capfd, check=False)
    assert again.returncode != 0 and again.stderr.strip().startswith(f"error: {dst}: exists")


def test_split_holdout_keeps_link_copies_together_and_lists_as_train_py_does(tmp_path, capfd):
    """A link farm's copies of one JPEG never land on both sides (the held-out score would be of
    trained images); dotfiles are not images; a class of one distinct image is one error line."""
    farm = tmp_path / "farm"
    run_script("scripts/make_synthetic_imagenet.py", "--out", farm, "--classes", 2, "--train-per-class", 5,
               "--val-per-class", 1, "--width", 64, "--height", 48, "--links", 4, "--workers", 1,
               capfd=capfd)  # fmt: skip
    (farm / "train" / "n00000000" / "._x.JPEG").write_bytes(b"macOS metadata")
    dst = tmp_path / "holdout"
    run_script("scripts/split_holdout.py", farm, dst, capfd=capfd)
    sides = {side: {p.resolve() for p in dst.glob(f"{side}/*/*")} for side in ("train", "val")}
    assert len(sides["train"]) == 8 and len(sides["val"]) == 2 and not sides["train"] & sides["val"]
    assert len(list(dst.glob("train/*/*"))) == 32 and not list(dst.glob("*/*/._*"))  # 4 names per JPEG
    assert len(scan_dataset(str(dst), verify=True).val) == 8
    for extra in (farm / "train" / "n00000001").iterdir():
        if os.path.realpath(extra) != os.path.realpath(next(iter(sorted((farm / "train" / "n00000001").iterdir())))):
            extra.unlink()
    single = run_script("scripts/split_holdout.py", farm, tmp_path / "h2", capfd=capfd, check=False)
    assert single.returncode != 0 and "n00000001: 1 distinct image(s)" in single.stderr and not (tmp_path / "h2").exists()


def test_split_holdout_keeps_hard_links_of_one_file_on_one_side(tmp_path, capfd):
    """`cp -al` or a dedup tool makes names of one file that realpath tells apart: grouped by inode."""
    src = tmp_path / "hl"
    for cls in ("a", "b"):
        folder = src / "train" / cls
        folder.mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), (i * 60, 0, 0)).save(folder / f"{i}.JPEG")
            for copy in (1, 2):
                os.link(folder / f"{i}.JPEG", folder / f"{i}_copy{copy}.JPEG")
    dst = tmp_path / "holdout"
    run_script("scripts/split_holdout.py", src, dst, "--fraction", "0.25", capfd=capfd)
    inodes = {side: {p.stat().st_ino for p in dst.glob(f"{side}/*/*")} for side in ("train", "val")}
    assert len(inodes["train"]) == 6 and len(inodes["val"]) == 2 and not inodes["train"] & inodes["val"]
    assert len(list(dst.glob("val/*/*"))) == 6  # every name of a held-out file, and no other


def test_split_holdout_keeps_a_file_in_several_classes_on_one_side(tmp_path, capfd):
    """A file linked into two class folders was split per class: held out in one, trained on in the
    other (imagenette-mini with 10 hard links from one class into another: 3 such leaks at 0.3)."""
    src = tmp_path / "src"
    for c, cls in enumerate(("a", "b", "c")):
        (src / "train" / cls).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (8, 8), (c * 80, i * 30, 0)).save(src / "train" / cls / f"{i}.JPEG")
    for i in range(6):  # a's images also in b (hard links) and c (symbolic links)
        os.link(src / "train" / "a" / f"{i}.JPEG", src / "train" / "b" / f"from_a_{i}.JPEG")
        os.symlink(src / "train" / "a" / f"{i}.JPEG", src / "train" / "c" / f"from_a_{i}.JPEG")
    for seed in range(5):
        dst = tmp_path / f"holdout{seed}"
        run_script("scripts/split_holdout.py", src, dst, "--fraction", "0.3", "--seed", seed, capfd=capfd)
        inodes = {side: {p.stat().st_ino for p in dst.glob(f"{side}/*/*")} for side in ("train", "val")}
        assert not inodes["train"] & inodes["val"], seed
        assert all(len(list(dst.glob(f"{side}/{cls}/*"))) for side in ("train", "val") for cls in "abc")
        assert len(list(dst.glob("*/*/*"))) == 3 * 8 + 2 * 6  # every name once


def test_split_holdout_killed_mid_way_leaves_no_dst(tmp_path):
    """Killed while linking, it left DST with the first classes only (100 classes of 600: a DST of 20
    train and 19 val classes that scan_dataset loads as a dataset), and the next pipeline step
    trained on it."""
    src = tmp_path / "src"
    for c in range(30):
        (src / "train" / f"n{c:08d}").mkdir(parents=True)
        for i in range(300):  # split_holdout lists names, it never decodes: empty files are enough
            (src / "train" / f"n{c:08d}" / f"{i}.JPEG").touch()
    dst = tmp_path / "out" / "holdout"
    (tmp_path / "out").mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "split_holdout.py"), str(src), str(dst)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    while proc.poll() is None and not any((tmp_path / "out").iterdir()):  # linking has begun
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    assert not dst.exists() or len(list(dst.glob("*/*/*"))) == 30 * 300
    script("split_holdout.py", src, tmp_path / "again")  # the rerun into a new DST works
    assert len(list((tmp_path / "again").glob("*/*/*"))) == 30 * 300


def test_make_synthetic_imagenet_links_make_long_epochs(tmp_path, capfd):
    out = tmp_path / "farm"
    proc = run_script("scripts/make_synthetic_imagenet.py", "--out", out, "--classes", 2, "--train-per-class", 3,
                      "--val-per-class", 1, "--width", 64, "--height", 48, "--links", 4, "--workers", 1,
                      capfd=capfd)  # fmt: skip
    assert "train: 24 entries (4 per JPEG)" in proc.stdout
    jpegs = [f for f in out.rglob("*.JPEG") if not f.is_symlink()]
    average_kb = round(sum(f.stat().st_size for f in jpegs) / len(jpegs) / 1e3)
    assert f"8 images, {average_kb} KB average" in proc.stdout  # the files', not 4x (the links counted)
    ds = scan_dataset(str(out), verify=True)  # symlinks pass the pre-flight check like files
    assert len(ds.train) == 24 and len(ds.val) == 2
    links = [Path(f) for f in ds.train.files if Path(f).is_symlink()]
    assert len(links) == 18 and all(not os.readlink(f).startswith("/") for f in links)  # relative: the farm moves
    assert {Path(f).resolve().name for f in ds.train.files} == {f.name for f in out.glob("train/*/*.JPEG") if not f.is_symlink()}
    x = run_script("scripts/make_synthetic_imagenet.py", "--out", tmp_path / "x", "--links", 0, capfd=capfd, check=False)
    assert x.returncode != 0


def test_the_links_are_made_before_the_folder_appears(tmp_path):
    """A kill while linking left a farm whose first classes had N entries per JPEG and the rest
    one (a biased train set), which a rerun refused to replace: the folder appeared before its links."""
    from dali_train.data.sample import make_image_folder

    seen = []  # what is at root while the images are being written: nothing, until the rename
    root = make_image_folder(tmp_path / "farm", num_classes=2, train_per_class=3, val_per_class=1,
                             train_links=4, progress=lambda n: seen.append((tmp_path / "farm").exists()))  # fmt: skip
    assert seen and not any(seen)
    per_class = [len(list(c.iterdir())) for c in sorted((root / "train").iterdir())]
    assert per_class == [12, 12], per_class


@pytest.mark.slow
def test_measure_startup_on_a_small_link_farm(tmp_path):
    out = tmp_path / "startup.json"
    proc = script("measure_startup.py", "--root", tmp_path / "farm", "--entries", 200, "--classes", 10,
                  "--jpegs-per-class", 2, "--workers", 1, "--json", out,
                  "--", "trainer.device=cpu", "loader.batch_size=16", "loader.num_threads=1")  # fmt: skip
    result = json.loads(out.read_text())
    assert result["train_entries"] == 200 and result["val_entries"] == 500 and result["bad_files"] == 0
    for phase in ("listing", "preflight_check", "first_batch", "epoch_switch", "switch_beside"):
        assert result[f"{phase}_s"] > 0 and result[f"{phase}_peak_rss_gib"] > 0.1
    assert 0 <= result["main_thread_stalled_beside_switch_s"] <= result["switch_beside_s"]
    assert 0 <= result["main_thread_longest_stall_s"] <= result["main_thread_stalled_beside_switch_s"]
    assert result["main_thread_stalled_beside_sleep_s"] < 1  # 2 s beside a sleeping thread
    assert -0.5 < result["main_thread_lost_beside_switch_s"] <= result["switch_beside_s"]  # seconds, not ms
    assert "200 train + 500 val entries: startup" in proc.stdout


def test_estimate_time_takes_one_gpus_share_of_a_multi_process_benchmark(capfd):
    """The 2-GPU benchmark's e2e row counts both processes: per GPU it is about the 1-GPU row, so
    the one-GPU estimate is about the same from either file (not half)."""
    runs = REPO / "docs" / "h200" / "gpu_benchmark_2026-12-01b"
    hours = []
    for name in ("2gpu_one_gpu.json", "2gpu_two_gpus.json"):
        out = run_script("scripts/estimate_time.py", "imagenet_rn50_90ep", "--benchmark", runs / name, "--gpus", 1,
                         capfd=capfd).stdout  # fmt: skip
        hours.append(float(out.strip().splitlines()[-1].split("|")[-2].strip().removesuffix(" h")))
    assert 0.9 < hours[1] / hours[0] < 1.1, hours


def test_estimate_time_needs_the_image_count_of_a_recipe_not_on_imagenet(capfd):
    """An Imagenette recipe was estimated with ImageNet's 1.28M images per epoch (135x too long)."""
    refused = run_script("scripts/estimate_time.py", "imagenette_128_5ep", "--img-s", 1000, capfd=capfd, check=False)
    assert refused.returncode == 1 and "data=imagenette: give its --train-images" in refused.stderr
    out = run_script("scripts/estimate_time.py", "imagenette_128_5ep", "--img-s", 1000, "--train-images", 9469,
                     "--gpus", 1, capfd=capfd).stdout  # fmt: skip
    assert out.strip().splitlines()[-1].endswith("| 15 s |")  # 5 x 9,469 images at 1000 x (224/128)^2 img/s
