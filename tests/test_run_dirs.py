"""Run directories: one per run, shared by all ranks of a run (the torchrun case is in test_train)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, launch_env, read_json, run_script

# train.py as `python train.py ARGS`, its slow imports done first; it says "ready", then waits for
# a wall-clock start time on stdin: two runs then take their run stamp within the same second.
START_AT = """
import os, runpy, sys, time
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # as `python train.py` does: this checkout's package
import hydra, timm, torch, nvidia.dali  # noqa: F401 - the slow imports, before the start signal
print("ready", flush=True)
start = float(sys.stdin.readline())
sys.argv = sys.argv[1:]
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


def wait_until_ready(proc: subprocess.Popen) -> str:
    """The output up to the child's "ready" line (import warnings may come first)."""
    lines = []
    for line in proc.stdout:
        if line.strip() == "ready":
            return "".join(lines)
        lines.append(line)
    raise AssertionError("".join(lines)[-3000:])


@pytest.mark.slow
def test_two_runs_started_in_the_same_second_get_two_run_dirs(tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", START_AT, str(REPO / "train.py"), *TINY_SYNTHETIC],
            cwd=tmp_path,
            env=launch_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    preambles = [wait_until_ready(p) for p in procs]
    start = int(time.time()) + 1.1  # the next whole second + 0.1 s: both stamps fall in one second
    for p in procs:
        p.stdin.write(f"{start}\n")
        p.stdin.flush()  # communicate() closes it
    outputs = [pre + p.communicate(timeout=300)[0] for pre, p in zip(preambles, procs, strict=True)]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert time.time() > start, "the runs did not wait for the common start"
    run_dirs = sorted(p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir())
    assert len(run_dirs) == 2, run_dirs
    assert len({d.name.split(".")[0] for d in run_dirs}) == 1  # the same second: the case of the issue
    for d in run_dirs:
        assert read_json(d / "summary.json")["epochs"] == 1
        assert len((d / "metrics.jsonl").read_text().splitlines()) == 1  # not mixed with the other run's


def test_an_evaluation_in_a_killed_runs_dir_leaves_its_config_logs_and_temp_files(tmp_path, capfd):
    """A run killed before it ended (no summary.json) still holds a run: an evaluation there writes
    eval_summary.json and .hydra-eval/, and keeps the run's .hydra/ and a checkpoint temp file (a
    trainer still running there may be writing it)."""
    run = tmp_path / "run"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", capfd=capfd)
    (run / "summary.json").unlink()  # as a kill before the end leaves it
    writing = run / "checkpoints" / ".last.pt.tmp-12345"
    writing.write_bytes(b"a checkpoint being written")
    kept = {p: p.read_bytes() for p in (run / "metrics.jsonl", run / ".hydra" / "overrides.yaml")}
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.eval_only=true", "trainer.resume=auto", capfd=capfd)
    assert {p: p.read_bytes() for p in kept} == kept
    assert writing.is_file()
    assert not (run / "summary.json").exists() and read_json(run / "eval_summary.json")["end_state"] == "completed"
    assert "trainer.eval_only=true" in (run / ".hydra-eval" / "overrides.yaml").read_text()
    elsewhere = tmp_path / "eval"  # an evaluation in a dir of its own records its config as any run does
    resume = f"trainer.resume={run / 'checkpoints' / 'last.pt'}"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={elsewhere}", "trainer.eval_only=true", resume, capfd=capfd)
    assert (elsewhere / ".hydra" / "config.yaml").is_file() and not (elsewhere / ".hydra-eval").exists()
    assert read_json(elsewhere / "summary.json")["end_state"] == "completed"
    assert not (elsewhere / "eval_summary.json").exists()


def test_an_evaluation_in_a_run_killed_in_its_first_epoch_leaves_its_config(tmp_path, capfd):
    """A run killed before its first metrics row or checkpoint has only its config record and log:
    an evaluation there (nothing to evaluate: it fails) still records apart from the run's."""
    run = tmp_path / "run"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", capfd=capfd)
    for leftover in ("summary.json", "metrics.jsonl", "checkpoints"):
        shutil.rmtree(run / leftover) if (run / leftover).is_dir() else (run / leftover).unlink()
    overrides = (run / ".hydra" / "overrides.yaml").read_bytes()
    evaluation = run_script(
        "train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.eval_only=true", "trainer.resume=auto",
        capfd=capfd, check=False,
    )
    assert evaluation.returncode != 0 and "last.pt" in evaluation.stderr, evaluation.stderr[-2000:]
    assert (run / ".hydra" / "overrides.yaml").read_bytes() == overrides
    assert not (run / "summary.json").exists() and read_json(run / "eval_summary.json")["end_state"] != "completed"



HOLD_LOCK = """
import fcntl, sys, time
with open(sys.argv[1], "ab") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # as a training run's rank 0 holds it
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_training_into_a_dir_where_another_process_trains_is_refused(tmp_path, capfd):
    """Two trainings in one dir (a chain's next `trainer.resume=auto hydra.run.dir=DIR` job submitted
    before the last one ended, the same command twice) both trained, writing the same checkpoints and
    log files: one line now, while the other process holds the dir's lock; once it ends, the same
    command resumes. An evaluation there is not refused."""
    run = tmp_path / "run"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", capfd=capfd)
    lock = run / ".training.lock"
    assert lock.is_file()  # the finished run's, no longer held
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        files = [p for p in run.rglob("*") if p.is_file() and p.name != "train.log"]
        kept = {p: p.read_bytes() for p in files}
        resume = [*TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.resume=auto", "trainer.epochs=2"]
        again = run_script("train.py", *resume, capfd=capfd, check=False)
        assert again.returncode == 2, again.stderr[-2000:]
        assert again.stderr.strip().splitlines() == [
            f"error: {run}: another process is training in this folder (it holds .training.lock); wait for it "
            "to end, or use another hydra.run.dir (with none training there, as after a node crash on NFS: delete "
            "that file)"
        ]
        assert {p: p.read_bytes() for p in files} == kept and not (run / ".hydra-refused").exists()
        run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.eval_only=true", "trainer.resume=auto", capfd=capfd)
    finally:
        holder.communicate("\n", timeout=30)
    resumed = run_script("train.py", *resume, capfd=capfd)
    assert resumed.returncode == 0 and read_json(run / "summary.json")["epochs"] == 2


def test_the_training_lock_ends_with_the_training_not_with_its_forked_workers(tmp_path):
    """A forked child (a loader=pytorch worker, persistent by default; a decode pool) shares the lock's
    open file: it held the lock after the training had ended, and a next training there was refused."""
    import multiprocessing

    from dali_train.run_dirs import training_elsewhere, training_lock

    fork = multiprocessing.get_context("fork")
    go = fork.Event()
    with training_lock(tmp_path, eval_only=False):
        worker = fork.Process(target=go.wait, args=(60,))
        worker.start()
        probe = subprocess.run([sys.executable, "-c", PROBE_LOCK, str(tmp_path)], capture_output=True, text=True, cwd=REPO)
        assert probe.stdout.strip() == "True", probe.stderr  # held, for another process
    try:
        assert worker.is_alive() and not training_elsewhere(tmp_path)
    finally:
        go.set()
        worker.join(30)


PROBE_LOCK = """
import sys
from pathlib import Path
from dali_train.run_dirs import training_elsewhere
print(training_elsewhere(Path(sys.argv[1])))
"""


def test_a_new_run_in_a_runs_dir_is_refused_before_anything_is_written(tmp_path, capfd):
    """Without trainer.resume, or resuming another run's checkpoint, a second run in a run's dir (a
    rerun into the same folder, a SLURM requeue) overwrote its config record and checkpoints and
    dropped or mixed its log rows: one line now."""
    run = tmp_path / "run"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", capfd=capfd)
    files = [p for p in run.rglob("*") if p.is_file() and p.name != "train.log"]
    kept = {p: p.read_bytes() for p in files}
    assert run / "checkpoints" / "last.pt" in kept and run / ".hydra" / "config.yaml" in kept
    again = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "seed=1", capfd=capfd, check=False)
    assert again.returncode == 2, again.stderr[-2000:]
    assert again.stderr.strip().splitlines() == [
        f"error: {run} holds a run already; continue it with trainer.resume=auto, or for a new run use another "
        "hydra.run.dir (hydra.sweep.dir in a sweep)"
    ]
    assert {p: p.read_bytes() for p in files} == kept and not (run / ".hydra-refused").exists()
    # so is another run's checkpoint: its logs were trimmed to that checkpoint's epoch and mixed with this one's
    other = tmp_path / "other"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={other}", capfd=capfd)
    from_other = f"trainer.resume={other}/checkpoints/last.pt"
    again = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.epochs=2", from_other, capfd=capfd, check=False)
    assert again.returncode == 2 and f"{run} holds a run already" in again.stderr, again.stderr[-2000:]
    assert {p: p.read_bytes() for p in files} == kept and not (run / ".hydra-refused").exists()
    # but a run started from the other's checkpoint goes on from its own last.pt in its later jobs
    # (the same command: a requeue, trainer.epochs_per_job, a torchrun restart)
    chained = [*TINY_SYNTHETIC, f"hydra.run.dir={tmp_path / 'chained'}", "trainer.epochs=3", "trainer.epochs_per_job=1", from_other]
    first = run_script("train.py", *chained, capfd=capfd)
    assert "resumed from " + str(other) in first.stdout + first.stderr
    second = run_script("train.py", *chained, capfd=capfd)
    assert f"resumed from {tmp_path / 'chained'}/checkpoints/last.pt at epoch 2" in second.stdout + second.stderr
    assert read_json(tmp_path / "chained" / "summary.json")["end_state"] == "completed"
    resumed = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.epochs=2", "trainer.resume=auto", capfd=capfd)
    # a run that ended with an error before training holds nothing: its corrected rerun goes in its dir
    failed = tmp_path / "failed"
    bad = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={failed}", "data.mean=[124,116,104]", capfd=capfd, check=False)
    assert bad.returncode == 2 and read_json(failed / "summary.json")["end_state"] == "error", bad.stderr[-2000:]
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={failed}", capfd=capfd)
    assert read_json(failed / "summary.json")["end_state"] == "completed"
    assert resumed.returncode == 0 and read_json(run / "summary.json")["epochs_completed"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("killed_early", [False, True])
def test_going_on_without_the_runs_last_pt_never_starts_it_over_from_random_weights(tmp_path, capfd, killed_early):
    """trainer.resume=auto in a dir without last.pt started over from random weights: a run begun
    from another run's checkpoint (refused since with advice that led there), and a run whose
    last.pt is gone, whose best.pt and log rows were then overwritten. Each is one line now; the
    run's own start again, or its best.pt, goes on."""
    other = tmp_path / "other"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={other}", capfd=capfd)
    start = f"{other}/checkpoints/last.pt"
    tuned = tmp_path / "tuned"  # its first epoch ended between best.pt and last.pt (a kill, say)
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={tuned}", "trainer.epochs=2", f"trainer.resume={start}", capfd=capfd)
    (tuned / "checkpoints" / "last.pt").unlink()
    if killed_early:  # killed in it: nothing but its config record left
        for path in [*tuned.glob("*.json*"), *tuned.glob("checkpoints/*")]:
            path.unlink()
    auto = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={tuned}", "trainer.epochs=2", "trainer.resume=auto",
                      capfd=capfd, check=False)  # fmt: skip
    assert auto.returncode == 2 and auto.stderr.strip().splitlines() == [
        f"error: {tuned}: its run started from trainer.resume={start} and saved no {tuned}/checkpoints/last.pt yet; "
        f"trainer.resume=auto would start it over from random weights: run it again with trainer.resume={start}"
    ], auto.stderr[-2000:]
    again = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={tuned}", "trainer.epochs=2", f"trainer.resume={start}",
                       capfd=capfd)  # fmt: skip
    assert f"resumed from {start} at epoch 1" in again.stdout + again.stderr
    run = tmp_path / "run"  # two epochs, then its last.pt removed
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.epochs=2", capfd=capfd)
    (run / "checkpoints" / "last.pt").unlink()
    kept = (run / "metrics.jsonl").read_bytes(), (run / "checkpoints" / "best.pt").read_bytes()
    auto = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.epochs=3", "trainer.resume=auto",
                      capfd=capfd, check=False)  # fmt: skip
    best = run / "checkpoints" / "best.pt"
    assert auto.returncode == 2 and auto.stderr.strip().splitlines() == [
        f"error: {run} holds 2 epochs of a run but not its {run}/checkpoints/last.pt, which each epoch writes: starting "
        f"over would overwrite its best.pt and logs; to go on from its best.pt copy it to {run}/checkpoints/last.pt, "
        "or use another hydra.run.dir"
    ], auto.stderr[-2000:]
    assert ((run / "metrics.jsonl").read_bytes(), best.read_bytes()) == kept
    shutil.copy(best, run / "checkpoints" / "last.pt")
    on = run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", "trainer.epochs=3", "trainer.resume=auto",
                    capfd=capfd)  # fmt: skip
    assert f"resumed from {run}/checkpoints/last.pt" in on.stdout + on.stderr
    assert read_json(run / "summary.json")["epochs_completed"] == 3


def test_a_sweep_job_whose_dir_holds_a_run_is_one_failed_job(tmp_path, capfd):
    """A sweep into a used sweep dir: the job whose dir holds a run is refused as a failed job (it
    was a traceback that ended the sweep without its summary), the others run, the sweep exits 2."""
    sweep = tmp_path / "sweep"
    run_script("train.py", "-m", *TINY_SYNTHETIC, f"hydra.sweep.dir={sweep}", "seed=0", capfd=capfd)
    kept = (sweep / "0" / ".hydra" / "overrides.yaml").read_bytes()
    again = run_script("train.py", "-m", *TINY_SYNTHETIC, f"hydra.sweep.dir={sweep}", "seed=1,2", capfd=capfd, check=False)
    assert again.returncode == 2, again.stderr[-2000:]
    assert again.stderr.strip().splitlines()[-1].startswith(f"error: 1 job(s) of the sweep failed; job 0: {sweep / '0'} holds a run")
    assert "Traceback" not in again.stderr and (sweep / "0" / ".hydra" / "overrides.yaml").read_bytes() == kept
    assert read_json(sweep / "1" / "summary.json")["end_state"] == "completed" and (sweep / "sweep_summary.md").is_file()


@pytest.mark.slow
def test_under_torchrun_a_restart_is_refused_too_and_only_rank_0_records(tmp_path, capfd):
    """A torchrun restart (--max-restarts) into a run's dir without resume got past the refusal (it
    skipped restarts) and overwrote the run: one rank shows it (the refusal is each process's own,
    before any rank joins the group or writes, so a second rank's is not visible here). An evaluation
    into a fresh dir by two gloo ranks is an evaluation of its own (summary.json, .hydra/): rank 1
    used to see the .hydra/ rank 0 had just written, record into .hydra-eval/, and make rank 0
    write eval_summary.json."""
    run = tmp_path / "run"
    run_script("train.py", *TINY_SYNTHETIC, f"hydra.run.dir={run}", capfd=capfd)
    kept = {p: p.read_bytes() for p in (run / ".hydra" / "overrides.yaml", run / "checkpoints" / "last.pt")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    restarted = subprocess.run(
        [*torchrun, "--nproc_per_node=1", "--max-restarts=1", str(REPO / "train.py"), *TINY_SYNTHETIC, "seed=5",
         f"hydra.run.dir={run}"],
        env=launch_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    refusals = [line for line in restarted.stderr.splitlines() if line.startswith("error: ") and "holds a run already" in line]
    assert restarted.returncode != 0 and len(refusals) == 2, restarted.stderr[-2000:]  # the first attempt and the restart
    assert {p: p.read_bytes() for p in kept} == kept
    fresh = tmp_path / "eval"
    evaluated = subprocess.run(
        [*torchrun, "--nproc_per_node=2", str(REPO / "train.py"), *TINY_SYNTHETIC, "trainer.eval_only=true",
         f"trainer.resume={run / 'checkpoints' / 'last.pt'}", f"hydra.run.dir={fresh}"],
        env=launch_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert read_json(fresh / "summary.json")["end_state"] == "completed"
    assert not (fresh / "eval_summary.json").exists() and not (fresh / ".hydra-eval").exists()
