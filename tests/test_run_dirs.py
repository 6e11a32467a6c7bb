"""Run directories: one per run, shared by all ranks of a run (the torchrun case is in test_train)."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import REPO, launch_env, read_json

# train.py as `python train.py ARGS`, started at a given wall-clock time, its imports done before:
# two runs then take their run stamp within the same second, deterministically.
START_AT = """
import os, runpy, sys, time
sys.path.insert(0, os.path.dirname(sys.argv[2]))  # as `python train.py` does: this checkout's package
import hydra, timm, torch, nvidia.dali  # noqa: F401 - the slow imports, before the start signal
start = float(sys.argv[1])
sys.argv = [sys.argv[2], *sys.argv[3:]]
time.sleep(max(start - time.time(), 0))
runpy.run_path(sys.argv[0], run_name="__main__")
"""

TINY_SYNTHETIC = [
    "trainer.device=cpu",
    "loader=synthetic",
    "loader.synthetic_steps=2",
    "loader.synthetic_val_steps=1",
    "loader.batch_size=4",
    "data.train_size=32",
    "data.val_size=32",
    "trainer.epochs=1",
]


def test_two_runs_started_in_the_same_second_get_two_run_dirs(tmp_path):
    start = int(time.time()) + 20.1  # a whole second + 0.1 s: both stamps fall in one second
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", START_AT, str(start), str(REPO / "train.py"), *TINY_SYNTHETIC],
            cwd=tmp_path,
            env=launch_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert time.time() > start, "the runs did not wait for the common start"
    run_dirs = sorted(p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir())
    assert len(run_dirs) == 2, run_dirs
    assert len({d.name.split(".")[0] for d in run_dirs}) == 1  # the same second: the case of the issue
    for d in run_dirs:
        assert read_json(d / "summary.json")["epochs"] == 1
        assert len((d / "metrics.jsonl").read_text().splitlines()) == 1  # not mixed with the other run's
