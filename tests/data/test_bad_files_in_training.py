"""run(cfg) on a folder with a file that passes the startup check but cannot be decoded: the
ending main turns into exit code 2 and one `error:` line (test_train runs that path as a subprocess)."""

from __future__ import annotations

import shutil

import torch
from PIL import Image

from tests.conftest import TINY, InProcessRun, exit_code, run_inprocess
from tests.data.test_loaders import plant


def error_lines(run: InProcessRun) -> list[str]:
    assert exit_code(run.ended) == 2 and "Traceback" not in run.log, run.log[-3000:]
    return str(run.ended).splitlines()


def test_pytorch_loader_a_damaged_train_file_saves_progress_and_names_the_file(small_root, tmp_path):
    """loader=pytorch: the worker's OSError becomes the same one line as with DALI, and the run
    keeps its last completed step."""
    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    bad = plant(str(sorted(data.glob("train/n00000004/*.JPEG"))[0]))
    run = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("loader.num_threads=")]  # a DALI key: not one of loader=pytorch
    args = [*tiny, f"data.root={data}", "trainer.epochs=1", "loader.batch_size=8"]
    error = error_lines(run_inprocess([*args, "loader=pytorch", "loader.num_workers=1"], run, check=False))
    assert len(error) == 1 and bad in error[0] and "data.exclude_list" in error[0], error
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert state["next_epoch"] == 0 and 0 <= state["next_step"] < 15


def test_a_damaged_val_file_is_one_line_naming_it(small_root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    bad = plant(str(sorted(data.glob("val/n00000006/*.JPEG"))[0]))
    args = [*TINY, f"data.root={data}", "trainer.epochs=1", "loader=dali_cpu"]
    error = error_lines(run_inprocess(args, tmp_path / "run", check=False))
    assert len(error) == 1 and bad in error[0] and "validation" in error[0], error


def test_a_file_pil_reads_and_dali_does_not_is_named(small_root, tmp_path):
    """A 1-bit TIFF as PIL writes it (no BitsPerSample: DALI refuses it) passes the startup check
    and PIL's decode: the error named no file among the batch's candidates (768 at batch 256)."""
    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    bad = data / "val" / "n00000006" / "onebit.tif"
    image = Image.new("1", (64, 48))
    image.paste(1, (0, 0, 32, 48))
    image.save(bad)
    args = [*TINY, f"data.root={data}", "trainer.epochs=1", "loader=dali_cpu"]
    error = error_lines(run_inprocess(args, tmp_path / "run", check=False))
    assert len(error) == 1 and str(bad) in error[0] and "validation" in error[0], error
