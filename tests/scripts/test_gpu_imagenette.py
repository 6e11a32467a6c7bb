"""scripts/gpu_imagenette.sh's guards (its runs need GPUs; these need none)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, launch_env


def gpu_imagenette(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_imagenette.sh"), *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**launch_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},  # its python
    )  # fmt: skip


def test_an_outdir_with_runs_is_refused_before_any_run(tmp_path):
    """A rerun into the same OUTDIR printed the old runs' table as its own, exit 0 (train.py refuses
    a new run over a run, into each run's .log only)."""
    (tmp_path / "runs" / "imagenette_128_5ep_s0").mkdir(parents=True)
    proc = gpu_imagenette(tmp_path / "data", tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {tmp_path}/runs holds runs already; choose a new OUTDIR"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["imagenette_128_5ep_s0"]


def test_a_run_that_fails_fails_the_script(tmp_path):
    proc = gpu_imagenette(tmp_path / "no-data", tmp_path / "out", "imagenette_128_5ep")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.count("failed; see its .log") == 3
    assert "no-data" in (tmp_path / "out" / "runs" / "imagenette_128_5ep_s0.log").read_text()
