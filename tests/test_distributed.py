"""Rank discovery (torchrun's variables, SLURM's srun variables, or one plain process) and joining the group."""

from __future__ import annotations

import ast
import datetime as dt
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dali_train import distributed
from dali_train.distributed import DistInfo, read_launch_env

REPO = Path(__file__).resolve().parents[1]

LAUNCH_VARS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
]


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables during the test, and the environment restored whole after it:
    read_launch_env writes RANK/WORLD_SIZE/... under srun, which would leak into later tests."""
    saved = dict(os.environ)
    for var in LAUNCH_VARS:
        os.environ.pop(var, None)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


def test_plain_process(clean_env):
    assert read_launch_env() == DistInfo(0, 0, 1)


def test_torchrun(clean_env):
    for k, v in {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}.items():
        clean_env.setenv(k, v)
    info = read_launch_env()
    assert info == DistInfo(5, 1, 8) and not info.is_main and info.enabled


def test_srun_derives_what_init_process_group_needs(clean_env):
    for k, v in {
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "16",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[01-02]",
    }.items():
        clean_env.setenv(k, v)
    assert read_launch_env() == DistInfo(9, 1, 16)
    assert os.environ["RANK"] == "9" and os.environ["WORLD_SIZE"] == "16" and os.environ["LOCAL_RANK"] == "1"
    assert os.environ["MASTER_PORT"] == str(20000 + 4242) and os.environ["MASTER_ADDR"]  # scontrol absent: loopback


def test_srun_with_one_task_is_a_plain_process(clean_env):
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_NTASKS", "1")
    assert read_launch_env() == DistInfo(0, 0, 1)


@pytest.mark.slow  # a torchrun subprocess
def test_the_run_stamp_is_shared_without_joining_the_group(tmp_path):
    """train.py shares rank 0's run stamp before its config sets CUDA_DEVICE_MAX_CONNECTIONS;
    joining the (NCCL) group starts CUDA, which fixes its queue count, so the stamp goes through
    the launcher's rendezvous store and the group is joined later, in run()."""
    probe = tmp_path / "probe.py"
    probe.write_text(  # one file per rank: two ranks' prints interleave on the shared stdout
        "import os, sys, torch, torch.distributed as td\n"
        "from dali_train.distributed import init_distributed, shared_run_stamp, shutdown\n"
        "stamp = shared_run_stamp()\n"
        "seen = [stamp, td.is_initialized(), torch.cuda.is_initialized()]\n"
        "init_distributed()\n"
        "seen.append(td.get_world_size())\n"
        "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(repr(seen))\n"
        "shutdown()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(probe), str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = [ast.literal_eval((tmp_path / rank).read_text()) for rank in ("0", "1")]
    assert seen[0][0] == seen[1][0]  # one stamp for both ranks
    assert all(s[1:] == [False, False, 2] for s in seen), seen  # no group, no CUDA; then both join the group


def test_srun_ranks_say_what_they_wait_for(tmp_path):
    """A process that SLURM's variables make one of several (a plain `python train.py` in an
    allocation of two tasks) waits for the others: once the wait is long, it says so, with the fix."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("TORCHELASTIC")}
    env.update(PYTHONPATH=str(REPO), SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_ID="7", MASTER_ADDR="127.0.0.1")
    code = "import dali_train.distributed as d; d.RENDEZVOUS_QUIET_S = 1; d.shared_run_stamp()"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    silent = threading.Timer(60, proc.kill)  # without the line, readline would wait out the 30-min join
    silent.start()
    try:
        first = proc.stderr.readline()  # rank 1 then retries its connection to rank 0's store
    finally:
        silent.cancel()
        proc.kill()
        proc.communicate()
    assert first.startswith("[rank 1] still waiting for 2 processes at 127.0.0.1:20007 (SLURM_NTASKS=2"), first
    assert "unset SLURM_NTASKS" in first


def test_a_launch_without_master_addr_gets_torchs_message(clean_env):
    """RANK and WORLD_SIZE set by hand without MASTER_ADDR, in a SLURM allocation (SLURM_PROCID set):
    torch's error names the variable (the srun wait line must not read it first: a bare KeyError).
    In this process: it fails before any store or group exists (a subprocess paid torch's import)."""
    for k in [k for k in os.environ if k.startswith("TORCHELASTIC")]:
        clean_env.delenv(k)
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "0"}.items():
        clean_env.setenv(k, v)
    clean_env.setattr(distributed, "_store", None)  # as a fresh process has it
    with pytest.raises(ValueError, match="MASTER_ADDR expected, but not set"):
        distributed.shared_run_stamp()


def test_rank_0_reads_the_ending_that_caused_its_failure_not_one_that_only_waited(monkeypatch):
    """Endings go through a real TCPStore (the launcher's, in a run; here in a process of its own).
    Rank 1 only timed out waiting, as rank 0 did; rank 2's bad file is the cause. Once the store's
    process is gone (under srun it is rank 0's), a rank reading it keeps its own ending."""
    import torch.distributed as torch_dist

    host = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, "
         "is_master=True, wait_for_workers=False); print(s.port, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(host.stdout.readline())
        store = torch_dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=5))
        monkeypatch.setattr(distributed, "_store", store)
        distributed.post_ending(DistInfo(1, 1, 3), "collective timed out", 2, "waited 3 s")
        distributed.post_ending(DistInfo(2, 2, 3), "bad file", 2, "DALI could not decode x.JPEG")
        rank0 = DistInfo(0, 0, 3)
        assert distributed.posted_ending(rank0, not_causes=("collective timed out",)) == (
            2, "bad file", 2, "DALI could not decode x.JPEG"
        )  # fmt: skip
        assert distributed.posted_ending(rank0)[0] == 1  # without the filter: the first posted
    finally:
        host.kill()
        host.wait()
    assert distributed.posted_ending(DistInfo(1, 1, 3), wait_s=0.2) is None
