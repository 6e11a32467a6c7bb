"""scripts/gpu_benchmark.sh end to end in its SMOKE mode: every step of the GPU measurement (data,
benchmark.py rows, train.py, the link farm's startup and switch), on CPU with tiny sizes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_the_1gpu_measurement_runs_every_step_and_writes_its_summary(tmp_path):
    # the script calls `python`: this suite's interpreter (CI runs .venv/bin/python without activating it)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "SMOKE": "1", "PYTHONPATH": str(REPO), "PATH": path}
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", "scripts/gpu_benchmark.sh", "1gpu", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = (out / "summary.md").read_text()
    for row in ("| resnet18 | 1 | off |", "| resnet18 | 1 | reduce-overhead |", "| resnet50 | 1 | off |"):
        assert row in summary
    assert "train.py resnet18, epoch 2:" in summary and "of the benchmark's e2e figure" in summary
    waits = re.search(r"waited ([\d.]+) / ([\d.]+) s for the next epoch's build after validation", summary)
    assert waits and all(float(w) < 30 for w in waits.groups())  # (0.000 here: the tiny build is hidden)
    assert "startup, 200 train + 500 val entries" in summary
    assert (out / "farm_train.metrics.jsonl").read_text().count("\n") == 3
