"""Resume, checkpoint safety and write order end to end: run(cfg) in-process; train.py subprocesses
where a real signal or a size-limited file system is the subject."""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dali_train.optim import build_scheduler
from tests.conftest import (
    REPO,
    TINY,
    InProcessRun,
    exit_code,
    launch_env,
    permissions_hold,
    read_json,
    run_inprocess,
)
from tests.test_checkpoint import crafted_checkpoint

STEPS = 3  # trainer.max_steps_per_epoch: 3 updates per epoch at batch 8


def args(root: Path, *extra: str) -> list[str]:
    return [*TINY, f"data.root={root}", "loader.batch_size=8", *extra]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


def assert_one_line_ending(run: InProcessRun, *needles: str) -> None:
    """In-process: what main turns into exit code 2 and one `error:` line (test_train runs that path)."""
    assert exit_code(run.ended) == 2 and "Traceback" not in run.log, run.log[-2000:]
    error = str(run.ended)
    assert "\n" not in error, error
    for needle in needles:
        assert needle in error, error


@pytest.fixture(scope="module")
def trained(small_root, tmp_path_factory) -> Path:
    """One epoch of test_resnet with EMA and SGD: checkpoints/last.pt and best.pt."""
    run = tmp_path_factory.mktemp("trained") / "run"
    run_inprocess(args(small_root, "trainer.epochs=1", f"trainer.max_steps_per_epoch={STEPS}", "trainer.ema=true"), run)
    return run


@pytest.mark.parametrize("key", ["trainer.resume", "model.pretrained"])
def test_a_crafted_checkpoint_never_runs(small_root, tmp_path, key):
    marker = tmp_path / "MARKER"
    evil = crafted_checkpoint(tmp_path / "evil.pt", marker)
    assert_one_line_ending(
        run_inprocess(args(small_root, f"{key}={evil}"), tmp_path / "run", check=False),
        f"{key}={evil}",
        "without running code",
    )
    assert not marker.exists()


def test_a_damaged_checkpoint_is_named_so_not_blamed_on_the_lr(small_root, trained, tmp_path):
    """A NaN/inf weight (bytes flipped in a tensor: torch.load checks no CRC) loaded silently and the
    run ended 'diverged ... lower optimizer.lr'; a file cut short was 'not readable without running
    code'. Both are one line naming a damaged file and the folder's other checkpoint."""
    state = torch.load(trained / "checkpoints" / "last.pt", weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name][0] = float("inf")
    flipped = tmp_path / "flipped.pt"
    torch.save(state, flipped)
    assert_one_line_ending(
        run_inprocess(args(small_root, "trainer.epochs=2", "trainer.ema=true", f"trainer.resume={flipped}"),
                      tmp_path / "a", check=False),  # fmt: skip
        f"trainer.resume={flipped}: 1 weight tensor(s) hold NaN/inf", "a damaged file", "best.pt or last.pt",
    )
    cut = tmp_path / "cut.pt"
    data = (trained / "checkpoints" / "last.pt").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_ending(
        run_inprocess(args(small_root, "trainer.epochs=2", f"trainer.resume={cut}"), tmp_path / "b", check=False),
        f"trainer.resume={cut}: a damaged or incomplete file", "best.pt or last.pt",
    )


def test_turning_the_ema_on_at_a_resume_says_where_it_starts(small_root, tmp_path):
    plain = tmp_path / "plain"
    run_inprocess(args(small_root, "trainer.epochs=1", f"trainer.max_steps_per_epoch={STEPS}"), plain)
    resume = f"trainer.resume={plain / 'checkpoints' / 'last.pt'}"
    on = run_inprocess(args(small_root, "trainer.epochs=2", f"trainer.max_steps_per_epoch={STEPS}", "trainer.ema=true",
                            resume), tmp_path / "on")  # fmt: skip
    assert "has no EMA weights; the EMA starts from its weights" in on.log


def test_more_epochs_on_resume_continue_on_the_longer_schedule(small_root, trained, tmp_path):
    """trainer.epochs 1 -> 2: epoch 1 trains on the 2-epoch cosine (it used to run at LR 0)."""
    run = tmp_path / "run"
    resume = f"trainer.resume={trained / 'checkpoints' / 'last.pt'}"
    run_inprocess(
        args(small_root, "trainer.epochs=2", f"trainer.max_steps_per_epoch={STEPS}", resume, "trainer.ema=true"), run
    )
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1 * 8 / 256)
    sched = SimpleNamespace(
        name="cosine", warmup_epochs=1, warmup_lr_init=1e-5, min_lr=0.0
    )  # conf/scheduler/cosine.yaml
    schedule = build_scheduler(sched, optimizer, steps_per_epoch=STEPS, epochs=2)
    logged = rows(run / "steps.jsonl")
    assert logged and all(r["epoch"] == 1 for r in logged)
    for r in logged:  # a row's LR is its update's: the schedule's value after the update before it
        schedule.step_update(num_updates=r["step"] - 1)
        assert math.isclose(r["train/lr"], optimizer.param_groups[0]["lr"], rel_tol=1e-6, abs_tol=1e-12), r
    assert any(r["train/lr"] > 0.1 * 0.1 * 8 / 256 for r in logged)


def test_a_finished_run_resumed_keeps_its_training_figures(small_root, trained, tmp_path):
    """resume=auto on a finished run (a sweep rerun to finish its preempted jobs) validates again;
    its summary's throughput and data wait were set to 0.0, the mean over no epoch."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = json.loads((run / "summary.json").read_text())
    again = args(small_root, "trainer.epochs=1", f"trainer.max_steps_per_epoch={STEPS}", "trainer.ema=true")
    after = run_inprocess([*again, "trainer.resume=auto"], run).summary
    assert before["train_img_s"] > 0 and after["epochs_completed"] == before["epochs_completed"] == 1
    assert (after["train_img_s"], after["data_wait_frac"]) == (before["train_img_s"], before["data_wait_frac"])
    (run / "summary.json").write_text("")  # a machine crash while it was written: resumed all the same
    assert run_inprocess([*again, "trainer.resume=auto"], run).summary["end_state"] == "completed"


def test_an_optimizer_change_on_resume_is_one_line(small_root, trained, tmp_path):
    resume = f"trainer.resume={trained / 'checkpoints' / 'last.pt'}"
    ended = run_inprocess(args(small_root, "optimizer=adamw", resume), tmp_path / "run", check=False)
    assert_one_line_ending(ended, "optimizer.name=adamw", "optimizer.name=sgd")


@pytest.mark.parametrize(
    "override, now, then",
    [
        ("model.stem_blur_pool=true", "model.stem_blur_pool=True", "model.stem_blur_pool=False"),
        ("model.blur_strided_convs=true", "model.blur_strided_convs=True", "model.blur_strided_convs=False"),
        ("+model.kwargs.act_layer=mish", "model.kwargs={'act_layer': 'mish'}", "model.kwargs={}"),
    ],
)
def test_a_network_change_no_tensor_shows_is_one_line_on_resume(small_root, trained, tmp_path, override, now, then):
    """A blur's filter is not a saved tensor, and another activation changes no shape: the check
    names the option (the weights loaded silently into the other network)."""
    resume = f"trainer.resume={trained / 'checkpoints' / 'last.pt'}"
    ended = run_inprocess(args(small_root, override, resume), tmp_path / "run", check=False)
    assert_one_line_ending(ended, now, then, "another network")


@pytest.mark.parametrize("how", ["resume", "evaluate", "evaluate_pretrained"])
def test_a_dataset_with_other_classes_is_one_line_on_resume_and_evaluation(small_root, trained, tmp_path, how):
    """The same data under class folders that sort in reverse (as many classes, so the head fits): every
    label meant another class, and the resume trained on (and an evaluation scored, of trainer.resume=
    or of model.pretrained=) without a word."""
    classes = sorted(p.name for p in (small_root / "train").iterdir())
    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
        for i, name in enumerate(classes):
            (tmp_path / "data" / split / f"{len(classes) - 1 - i:02d}_{name}").symlink_to(small_root / split / name)
    last = trained / "checkpoints" / "last.pt"
    key = "model.pretrained" if how == "evaluate_pretrained" else "trainer.resume"
    overrides = {"resume": ["trainer.epochs=2", "trainer.ema=true"]}.get(how, ["trainer.eval_only=true"])
    extra = [f"data.root={tmp_path / 'data'}", f"{key}={last}", *overrides]
    ended = run_inprocess(args(small_root, *extra), tmp_path / "run", check=False)
    assert_one_line_ending(
        ended, f"data.root={tmp_path / 'data'}", f"{key}={last} was trained on", f"label 0 is '00_{classes[-1]}' here"
    )


def test_an_ema_checkpoint_resumes_with_its_ema_and_is_evaluated_on_it(small_root, trained, tmp_path):
    """best.pt and the logged top-1 of an EMA run are its EMA weights': a resume without the EMA is
    one line (it dropped them), and an evaluation takes them (it evaluated the raw weights)."""
    last = trained / "checkpoints" / "last.pt"
    ended = run_inprocess(args(small_root, "trainer.epochs=2", f"trainer.resume={last}"), tmp_path / "a", check=False)
    assert_one_line_ending(ended, "trainer.ema=false", "trainer.ema=true", f"model.pretrained={last}")
    evaluated = run_inprocess(args(small_root, "trainer.eval_only=true", f"trainer.resume={last}"), tmp_path / "b")
    assert "holds EMA weights" in evaluated.log
    assert evaluated.summary["val_loss"] == pytest.approx(read_json(trained / "summary.json")["val_loss"], rel=1e-5)



def test_an_evaluation_needs_only_the_network_to_match(small_root, trained, tmp_path):
    """eval_only reads the weights, not the optimizer state: a checkpoint of another optimizer
    (or accumulation, or batch size) evaluates, where the resume checks refused it."""
    last = trained / "checkpoints" / "last.pt"
    overrides = ("optimizer=adamw", "trainer.grad_accum_steps=2", "trainer.eval_only=true", f"trainer.resume={last}")
    evaluated = run_inprocess(args(small_root, *overrides), tmp_path / "eval")
    assert evaluated.summary["val_loss"] == pytest.approx(read_json(trained / "summary.json")["val_loss"], rel=1e-5)

def test_eval_only_in_the_training_runs_dir_leaves_its_logs_and_summary(small_root, tmp_path):
    """Evaluating an earlier checkpoint of a run in that run's dir: its metrics, steps and summary
    stay (the evaluation dropped the later epochs' rows and overwrote summary.json)."""
    run, common = tmp_path / "run", args(small_root, f"trainer.max_steps_per_epoch={STEPS}")
    run_inprocess([*common, "trainer.epochs=1"], run)
    first = run / "checkpoints" / "epoch1.pt"
    shutil.copy(run / "checkpoints" / "last.pt", first)
    run_inprocess([*common, "trainer.epochs=2", "trainer.resume=auto"], run)
    logs = {name: (run / name).read_text() for name in ("metrics.jsonl", "steps.jsonl", "summary.json")}
    run_inprocess([*common, "trainer.eval_only=true", f"trainer.resume={first}"], run)
    assert {name: (run / name).read_text() for name in logs} == logs
    assert read_json(run / "eval_summary.json")["val_samples"] == 50  # 10 classes x 5


def test_a_negative_lr_is_one_line(small_root, tmp_path):
    assert_one_line_ending(
        run_inprocess(args(small_root, "optimizer.lr=-0.1"), tmp_path / "run", check=False), "optimizer.lr=-0.1"
    )


def test_eval_only_with_resume_auto_and_no_checkpoint_has_nothing_to_evaluate(small_root, tmp_path):
    ended = run_inprocess(
        args(small_root, "trainer.eval_only=true", "trainer.resume=auto"), tmp_path / "run", check=False
    )
    assert_one_line_ending(ended, "nothing to evaluate")


def signal_at_line(cmd: list[str], marker: str, signum: int, **popen) -> tuple[int, str]:
    """`cmd` as a process, sent `signum` once it prints a line containing `marker` (or after 180 s):
    its exit code and all it printed."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )
    output, deadline = [], time.time() + 180
    for line in proc.stdout:
        output.append(line)
        if marker in line or time.time() > deadline:
            proc.send_signal(signum)
            break
    text = "".join(output) + proc.communicate(timeout=120)[0]
    return proc.returncode, text


@pytest.mark.slow
def test_sigterm_finishes_the_step_saves_last_pt_and_exits(small_root, tmp_path):
    """SIGTERM mid-epoch: the step finishes, last.pt keeps the position, exit code 128+15. Resumed
    with batch 8 -> 16 or another seed: one line naming the key (a mid-epoch position has no mapping);
    resumed as it was (resume=auto in its run dir): it continues at that step."""
    run = tmp_path / "run"
    common = args(small_root, "trainer.epochs=50", "trainer.log_every_n_steps=1")
    cmd = [sys.executable, str(REPO / "train.py"), *common, f"hydra.run.dir={run}"]
    code, text = signal_at_line(cmd, "epoch 0 3/", signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "stopped by signal" in text
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["next_epoch"] == 0 and state["next_step"] >= 3  # mid-epoch: resume skips trained batches

    ended = run_inprocess(
        args(small_root, "loader.batch_size=16", f"trainer.resume={last}"), tmp_path / "a", check=False
    )
    assert_one_line_ending(ended, "loader.batch_size=16", "loader.batch_size=8", "mid-epoch")
    # another seed draws another order for the rest of the epoch (it went through without a word)
    ended = run_inprocess(args(small_root, "seed=5", f"trainer.resume={last}"), tmp_path / "s", check=False)
    assert_one_line_ending(ended, "seed=5", "seed=0", "mid-epoch")
    # a cap below the saved position: nothing of that epoch is left to train (not one step past the cap)
    capped = args(small_root, "trainer.max_steps_per_epoch=2", f"trainer.resume={last}")
    ended = run_inprocess(capped, tmp_path / "b", check=False)
    assert_one_line_ending(ended, f"step {state['next_step']}", "at most 2 steps", "trainer.max_steps_per_epoch")

    stopped_s = json.loads((run / "summary.json").read_text())["wall_time_s"]
    assert 0 < state["wall_time_s"] <= stopped_s  # the run's time at the save
    resumed = run_inprocess([*common, "trainer.epochs=1", "trainer.resume=auto"], run)
    assert f"at epoch 0 step {state['next_step']}" in resumed.log
    # the run's clock goes on from the save: the part epoch before it counts (it went on from 0 here)
    assert resumed.summary["wall_time_s"] == pytest.approx(state["wall_time_s"] + resumed.summary["job_wall_time_s"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["wall_time_s"] > state["wall_time_s"]


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_saves_and_ends_in_one_line(small_root, tmp_path):
    """SIGINT where Python's own handler is installed (a terminal's Ctrl-C; a background job ignores
    SIGINT): last.pt saved, exit 128+2, and no KeyboardInterrupt traceback from that handler. That
    mid-epoch checkpoint resumed with shorter epochs continues on the new schedule's position (it kept
    the old update count, and the run's last updates went past the schedule's end, at min_lr)."""
    run = tmp_path / "run"
    common = args(small_root, "trainer.epochs=50", "trainer.max_steps_per_epoch=6", "trainer.log_every_n_steps=1")
    cmd = [sys.executable, str(REPO / "train.py"), *common, f"hydra.run.dir={run}"]

    def default_sigint() -> None:  # as a terminal leaves it: Python then installs its own handler
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    code, text = signal_at_line(cmd, "epoch 1 2/", signal.SIGINT, preexec_fn=default_sigint)
    assert code == 128 + signal.SIGINT, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert json.loads((run / "summary.json").read_text())["end_state"] == "stopped by signal"
    last = run / "checkpoints" / "last.pt"
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["next_epoch"] == 1 and 2 <= saved["next_step"] < 5, saved["next_step"]

    shorter = args(small_root, "trainer.epochs=2", "trainer.max_steps_per_epoch=5", f"trainer.resume={last}")
    resumed = run_inprocess(shorter, tmp_path / "shorter")
    assert "updates per epoch changed from 6 to 5" in resumed.log
    final = torch.load(tmp_path / "shorter" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert final["global_step"] == 2 * 5  # the 2-epoch schedule's length, no update past it


# train.py under a SIGUSR2 handler of its own, as submitit installs one (its requeue): the handler
# records whether the run had saved last.pt and summary.json when it was called.
UNDER_A_REQUEUE_HANDLER = """
import json, os, runpy, signal, sys
run = sys.argv[1]
def requeue(signum, frame):
    saved = [os.path.isfile(os.path.join(run, f)) for f in ("checkpoints/last.pt", "summary.json")]
    open(os.path.join(run, "requeued.json"), "w").write(json.dumps(saved))
signal.signal(signal.SIGUSR2, requeue)
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_sigusr2_saves_then_hands_over_to_the_handler_before_it(small_root, tmp_path):
    """SLURM's --signal (submitit: SIGUSR2 before the time limit): the step finishes, last.pt and
    summary.json are written, then the handler that was there before runs (submitit requeues in it)."""
    run = tmp_path / "run"
    common = args(small_root, "trainer.epochs=50", "trainer.log_every_n_steps=1", f"hydra.run.dir={run}")
    cmd = [sys.executable, "-c", UNDER_A_REQUEUE_HANDLER, str(run), str(REPO / "train.py"), *common]
    code, text = signal_at_line(cmd, "epoch 0 3/", signal.SIGUSR2)
    assert code == 128 + signal.SIGUSR2, text[-3000:]
    assert json.loads((run / "requeued.json").read_text()) == [True, True]
    assert json.loads((run / "summary.json").read_text())["end_state"] == "stopped by signal"
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert state["next_epoch"] == 0 and state["next_step"] >= 3


def test_batch_size_change_at_an_epoch_boundary_maps_by_epoch(small_root, trained, tmp_path):
    """The end-of-epoch checkpoint resumed with batch 8 -> 16: the schedule continues at epoch 1 of
    the new batch size's schedule (the documented mapping; mid-epoch: the SIGTERM test above)."""
    mapped = tmp_path / "b"
    resume = f"trainer.resume={trained / 'checkpoints' / 'last.pt'}"
    resumed = run_inprocess(
        [*args(small_root, "trainer.epochs=2", resume, "trainer.ema=true"), "loader.batch_size=16"], mapped
    )
    assert "updates per epoch changed from 3 to 8" in resumed.log
    assert torch.load(mapped / "checkpoints" / "last.pt", weights_only=True)["global_step"] == 2 * 8


def test_grad_accum_schedule_length_is_the_updates_made(small_root, tmp_path):
    """5 micro-steps at accumulation 2 make 3 updates per epoch: every update runs at a live LR, and
    the schedule reaches min_lr (0) as the run ends (floor made 2 per epoch: the last updates ran at 0)."""
    run = tmp_path / "run"
    run_inprocess(
        args(small_root, "trainer.epochs=2", "trainer.max_steps_per_epoch=5", "trainer.grad_accum_steps=2")
        + ["trainer.log_every_n_steps=1"],
        run,
    )
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["global_step"] == 6
    logged = rows(run / "steps.jsonl")  # the LR each logged update ran at
    assert len(logged) == 10 and all(r["train/lr"] > 0 for r in logged), logged
    assert rows(run / "metrics.jsonl")[-1]["lr"] == logged[-1]["train/lr"]  # the epoch row: its last update's


@pytest.mark.slow
def test_sigkill_after_the_log_row_then_resume_auto_keeps_one_row_per_epoch(small_root, tmp_path):
    """Killed right after epoch 0's metrics row: last.pt never claims an epoch without its row; a
    stale temp file is removed at start; the resumed run redoes the epoch and the logs have each
    epoch and step once."""
    run = tmp_path / "run"
    common = args(small_root, "trainer.epochs=2", f"trainer.max_steps_per_epoch={STEPS}", "trainer.resume=auto")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *common, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=launch_env(),
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not rows(run / "metrics.jsonl") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    last = run / "checkpoints" / "last.pt"
    if last.is_file():  # the kill came after the write: it claims epoch 0 only, which has its row
        assert torch.load(last, weights_only=True)["next_epoch"] <= len(rows(run / "metrics.jsonl"))
    stale = run / "checkpoints" / ".last.pt.tmp-99999"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"half a checkpoint")
    time.sleep(1.1)  # TensorBoard reads event files in name order: the second they were made, then the pid
    out = run_inprocess(common, run)
    assert "removed" in out.log and not stale.exists()
    assert [r["epoch"] for r in rows(run / "metrics.jsonl")] == [0, 1]
    steps = [r["step"] for r in rows(run / "steps.jsonl")]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) and steps[-1] == 2 * STEPS
    events = EventAccumulator(str(run / "tensorboard"))  # TensorBoard shows each step once too
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == steps


@pytest.mark.slow
def test_a_torchrun_restart_resumes_in_the_same_run_dir(small_root, tmp_path):
    """torchrun --max-restarts restarts every worker when one dies: with trainer.resume=auto the new
    attempt must find the first attempt's last.pt, i.e. write to the same (default) run dir."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1"]
    train = args(small_root, "trainer.epochs=3", f"trainer.max_steps_per_epoch={STEPS}", "trainer.resume=auto")
    proc = subprocess.Popen(
        [*cmd, str(REPO / "train.py"), *train], cwd=tmp_path, env=launch_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("outputs/*/*/checkpoints/last.pt")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.01)
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(workers) == 2, workers
        os.kill(int(workers[-1]), signal.SIGKILL)  # rank 1 dies; torchrun restarts both
        _, stderr = proc.communicate(timeout=300)
    finally:  # a hung attempt must not outlive the test
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    run_dirs = [d for d in tmp_path.glob("outputs/*/*") if d.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    assert "resumed from" in (run_dirs[0] / "train.log").read_text()
    assert [r["epoch"] for r in rows(run_dirs[0] / "metrics.jsonl")] == [0, 1, 2]


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_checkpoint_folder_the_run_cannot_write_to_is_one_line_before_training(small_root, tmp_path, nproc):
    """It was found at the first save, once an epoch had trained and validated, and reported as a
    full disk with the whole disk free. Under torchrun every rank says the same line (rank 0 finds
    it; the others would wait for it in their first collective)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints").chmod(0o555)
    launch = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] * (nproc > 1))
    cmd = [*permissions_hold(), *launch, str(REPO / "train.py"), *args(small_root, f"hydra.run.dir={run}")]
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    line = f"error: {run / 'checkpoints'}: checkpoints cannot be written there (Permission denied)"
    assert "epoch 0" not in proc.stdout + proc.stderr
    assert read_json(run / "summary.json")["end_state"] == "error"
    if nproc == 1:
        assert_one_line_error(proc, line.removeprefix("error: "))
        return
    errors = [text for text in proc.stderr.splitlines() if text.startswith("error:")]
    assert errors == [line, line] and "exitcode: 2" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_write_is_one_line_and_keeps_the_previous(small_root, tmp_path):
    """test_resnet checkpoints are ~2.9 MiB; an 8 MiB tmpfs holds epoch 0's best.pt and last.pt
    but not a third file. Without mount permission, RLIMIT_FSIZE makes every checkpoint write fail."""
    run = tmp_path / "fs" / "run"
    mounted = _tmpfs(tmp_path / "fs", "8m")
    limit = (
        None
        if mounted
        else (
            lambda: (
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN),
                resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20)),
            )
        )
    )
    try:
        cmd = [
            sys.executable,
            str(REPO / "train.py"),
            *args(small_root, "trainer.epochs=3", f"hydra.run.dir={run}"),
        ]
        cmd += [
            f"trainer.max_steps_per_epoch={STEPS}",
            "optimizer.lr=1e-9",
        ]  # same accuracy every epoch: best.pt rewritten
        proc = subprocess.run(
            cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300, preexec_fn=limit
        )
        kept = "is kept" if mounted else "there is no earlier"  # the file size limit fails the first write
        assert_one_line_error(proc, f"could not write {run / 'checkpoints'}", "MiB", kept)
        assert "a checkpoint write may fail" in proc.stdout or not mounted
        assert not list((run / "checkpoints").glob(".*.tmp-*"))
        if mounted:
            assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["next_epoch"] == 1
    finally:
        if mounted:
            subprocess.run(["umount", str(tmp_path / "fs")], check=False)
    shutil.rmtree(tmp_path / "fs", ignore_errors=True)
