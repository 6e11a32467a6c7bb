"""Shared fixtures: real JPEG folders on disk and a helper that runs train.py as users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dali_train.data.sample import make_image_folder

REPO = Path(__file__).resolve().parents[1]
IMAGENETTE_MINI = REPO.parent / "shared" / "data" / "imagenette-mini"
LAUNCHER_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "GROUP_RANK",
    "DALI_TRAIN_RUN_STAMP",
}

# Small and fast on 2 CPU cores: 32 px crops of the 80 px sample images.
TINY = [
    "trainer.device=cpu",
    "data.train_size=32",
    "data.val_resize=36",
    "data.val_size=32",
    "loader.batch_size=16",
    "loader.num_threads=2",
    "trainer.log_every_n_steps=2",
]


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """The demo's sample dataset: 10 classes, 400 train / 100 val JPEGs (generated once)."""
    return make_image_folder(tmp_path_factory.mktemp("data") / "sample", workers=2)


@pytest.fixture(scope="session")
def small_root(tmp_path_factory) -> Path:
    """A smaller set (10 classes × 12 train / 5 val) for multi-epoch and multi-process runs."""
    return make_image_folder(tmp_path_factory.mktemp("data") / "small", train_per_class=12, val_per_class=5)


@pytest.fixture
def imagenette_mini() -> Path:
    if not IMAGENETTE_MINI.is_dir():
        pytest.skip(f"{IMAGENETTE_MINI} is absent (it sits beside the project checkout in development)")
    return IMAGENETTE_MINI


def launch_env() -> dict[str, str]:
    """The environment for a child train.py/torchrun: no inherited rank variables (pytest itself
    may run inside a SLURM job or torchrun; torchrun sets its own), one OpenMP thread."""
    inherited = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    return {**inherited, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_train(
    args: list[str],
    *,
    nproc: int = 1,
    cwd: Path | None = None,
    timeout: int = 600,
    check: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run train.py in a subprocess (under torchrun with gloo when nproc > 1)."""
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        cmd = [sys.executable]
    full_env = {**launch_env(), **(env or {})}
    proc = subprocess.run(
        cmd + [str(REPO / "train.py"), *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
