"""How a run ends: divergence, out of memory, a bad file mid-run, a stopped rank, config errors.
Each writes summary.json's end_state and exits with one line: run(cfg), the engine or train.py's
command line (run_script) in-process; subprocesses where a signal or several processes are the subject."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dali_train.data.folder import scan_dataset
from dali_train.data.order import epoch_order
from dali_train.distributed import DistInfo
from dali_train.divergence import Diverged
from dali_train.ending import RunShape, ending_for
from dali_train.engine import LoopControl, TrainParts, train_one_epoch
from dali_train.logs import MetricsWriter
from dali_train.optim import build_scheduler
from tests.conftest import REPO, TINY, InProcessRun, exit_code, launch_env, read_json, run_inprocess, run_script
from tests.data.damage import damage_huffman_table
from tests.helpers import oom_model

DIVERGING = ["optimizer.lr=1e5", "trainer.epochs=2", "trainer.log_every_n_steps=2"]


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def error_line(run: InProcessRun) -> str:
    """In-process: the one `error:` line main prints for exit code 2 (test_train runs that path)."""
    assert exit_code(run.ended) == 2 and "Traceback" not in run.log, run.log[-3000:]
    assert "\n" not in str(run.ended), str(run.ended)
    return str(run.ended)


def test_a_nan_loss_stops_the_run_and_keeps_the_last_finite_checkpoint(small_root, tmp_path):
    run = tmp_path / "run"
    line = error_line(
        run_inprocess([*TINY, *DIVERGING, f"data.root={small_root}", "trainer.save_every_n_steps=2"], run, check=False)
    )
    assert "the loss became NaN/inf at epoch 0 step" in line and "last finite loss" in line and " lr " in line
    summary = read_json(run / "summary.json")
    update = int(summary["end_state"].removeprefix("diverged at step "))
    assert f"(update {update})" in line and summary["epochs_completed"] == 0
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert 0 < state["global_step"] < update
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
    assert not (run / "checkpoints" / "best.pt").exists()


def test_skipping_nonfinite_updates_is_bounded(small_root, tmp_path):
    run = tmp_path / "run"
    ended = run_inprocess(
        [*TINY, *DIVERGING, f"data.root={small_root}", "trainer.max_nonfinite_skips=2"], run, check=False
    )
    line = error_line(ended)
    assert "skipped update 1 of 2 allowed" in ended.log and "skipped update 2 of 2 allowed" in ended.log
    assert "after 2 skipped updates = trainer.max_nonfinite_skips" in line
    assert read_json(run / "summary.json")["end_state"].startswith("diverged at step ")


def _parts(model: torch.nn.Module, scaler: torch.amp.GradScaler | None = None) -> TrainParts:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    from omegaconf import OmegaConf

    sched_cfg = OmegaConf.create({"name": "cosine", "warmup_epochs": 0, "warmup_lr_init": 0, "min_lr": 0})
    scheduler = build_scheduler(sched_cfg, optimizer, steps_per_epoch=8, epochs=1)
    return TrainParts(
        model, optimizer, scheduler, torch.nn.CrossEntropyLoss(), torch.device("cpu"), DistInfo(0, 0, 1), scaler=scaler
    )


def _batches(nan_at: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(8)]
    if nan_at is not None:
        batches[nan_at][0][0, 0] = float("nan")
    return batches


@pytest.mark.parametrize("skips", [0, 1])
def test_one_nan_batch_stops_or_is_skipped_in_process(tmp_path, skips):
    model = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.BatchNorm1d(3))  # BN: the NaN reaches its stats
    parts = _parts(model)
    ctl = LoopControl(MetricsWriter(tmp_path, False), log_every=4, max_nonfinite_skips=skips)
    if skips == 0:
        with pytest.raises(Diverged, match=r"at epoch 0 step 3 \(update 3\), lr [0-9.]+ at that step") as e:
            train_one_epoch(parts, _batches(nan_at=2), ctl, epoch=0)
        assert e.value.update == 3
        return
    stats = train_one_epoch(parts, _batches(nan_at=2), ctl, epoch=0)
    assert ctl.skipped_updates == 1 and parts.global_step == 8  # the schedule still moved on
    assert all(torch.isfinite(p).all() for p in model.parameters()) and torch.isfinite(torch.tensor(stats.loss))
    assert all(torch.isfinite(b).all() for b in model.buffers())  # the skipped window's BN stats put back


def test_fp16_grad_scaler_skips_are_not_divergence(tmp_path):
    """Scaled gradients that overflow (the loss itself finite) make the GradScaler skip updates
    and lower its scale: training goes on."""
    model = torch.nn.Linear(8, 3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1000)
    parts = _parts(model, scaler)
    ctl = LoopControl(MetricsWriter(tmp_path, False), log_every=1)
    batches = [(x * 1000, y) for x, y in _batches()]  # gradients ~1e3 x scale 1.7e38 overflow float32
    train_one_epoch(parts, batches, ctl, epoch=0)
    assert scaler.get_scale() < 2.0**127  # it did skip
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_cuda_out_of_memory_is_one_line_with_the_keys_to_change(small_root, tmp_path):
    run = tmp_path / "run"
    ended = run_inprocess([*TINY, f"data.root={small_root}", f"model.name={oom_model.NAME}"], run, check=False)
    line = error_line(ended)
    for text in (oom_model.NAME, "loader.batch_size=16", "trainer.grad_accum_steps", "channels_last", "amp"):
        assert text in line, line
    assert read_json(run / "summary.json")["end_state"] == "out of memory"


def test_a_bad_file_in_val_keeps_the_trained_epoch(small_root, tmp_path):
    """A truncated JPEG that the startup check would have skipped reaches DALI's val pipeline."""
    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    good = next(data.glob("val/*/*.JPEG")).read_bytes()
    bad = data / "val" / "n00000009" / "zz_truncated.JPEG"  # sorts last: not in the first val batch
    bad.write_bytes(good[: len(good) // 3])
    run = tmp_path / "run"
    args = [*TINY, f"data.root={data}", "trainer.epochs=2", "data.verify_files=false"]
    line = error_line(run_inprocess(args, run, check=False))
    assert str(bad) in line
    assert read_json(run / "summary.json")["end_state"] == "bad file"
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert (state["next_epoch"], state["next_step"], state["global_step"]) == (1, 0, 8)


def test_running_out_of_memory_in_validation_keeps_the_trained_epoch(small_root, tmp_path):
    """Not only a bad val file: any failure of the first validation (here memory, as at a larger
    val side) ended the run with the trained epoch unsaved."""
    run = tmp_path / "run"
    args = [*TINY, f"data.root={small_root}", f"model.name={oom_model.EVAL_NAME}", "trainer.epochs=2"]
    line = error_line(run_inprocess(args, run, check=False))
    assert oom_model.EVAL_NAME in line and "out of memory" in line.lower(), line
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert (state["next_epoch"], state["next_step"], state["global_step"]) == (1, 0, 8)


def test_a_full_disk_at_the_save_after_a_failed_validation_keeps_the_validations_error(small_root, tmp_path):
    """The save that keeps the trained epoch fails too (a 16 KiB file size limit stands in for a full
    disk: the test model's checkpoint is ~19 KiB, its log ~3 KiB): the run ends on the validation's
    error, the save's logged.
    The checkpoint's own error (not an OSError) replaced it and ended the run "disk full"."""
    run = tmp_path / "run"
    args = [*TINY, f"data.root={small_root}", f"model.name={oom_model.EVAL_NAME}", "trainer.epochs=2"]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), no signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 2**10, hard))
    try:
        line = error_line(run_inprocess(args, run, check=False))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert oom_model.EVAL_NAME in line and "out of memory" in line.lower(), line
    assert read_json(run / "summary.json")["end_state"] == "out of memory"
    assert "could not save" in (run / "train.log").read_text()
    assert not (run / "checkpoints" / "last.pt").exists()


def test_a_bad_file_in_the_next_epochs_first_batch_keeps_the_validated_epoch(small_root, tmp_path, monkeypatch):
    """Epoch 1's pipeline is built, and its first batch decoded, on a thread while epoch 0 is
    validated. A file damaged once epoch 0 has trained (every file is in every epoch, so it cannot
    be planted earlier) fails there: epoch 0 is still validated, logged and saved, then the run
    ends with the one line naming the file."""
    from dali_train import fit

    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    files = scan_dataset(str(data), verify=False).train.files
    bad = Path(files[epoch_order(len(files), seed=0, epoch=1, batch_size=16, world_size=1).rank_block(0, 1)[5]])
    real_train_one_epoch = fit.train_one_epoch

    def then_damage(*args, **kwargs):
        stats = real_train_one_epoch(*args, **kwargs)
        if kwargs["epoch"] == 0:
            bad.write_bytes(damage_huffman_table(bad.read_bytes()))  # batch 0 of epoch 1
        return stats

    monkeypatch.setattr(fit, "train_one_epoch", then_damage)
    run = tmp_path / "run"
    line = error_line(run_inprocess([*TINY, f"data.root={data}", "trainer.epochs=2"], run, check=False))
    assert str(bad) in line and "epoch 1, batch 0" in line
    assert read_json(run / "summary.json")["end_state"] == "bad file"
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 and json.loads(rows[0])["val_samples"] == 50  # epoch 0, validated in full
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert (state["next_epoch"], state["next_step"], state["global_step"]) == (1, 0, 8)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("epoch-")]  # the build thread joined


@pytest.mark.parametrize(
    "args, message",
    [
        (["data=imagenet"], "data.root: no value"),
        (["trainer.max_nonfinite_skips=many"], "max_nonfinite_skips"),
    ],  # an unknown key (loader.batchsize=3): test_config's typo test, a subprocess
)
def test_config_errors_exit_2_without_a_traceback(tmp_path, args, message, capfd):
    """`python train.py` in this process: a missing value (main's check) and a wrong type (Hydra's)."""
    proc = run_script("train.py", *TINY, *args, f"hydra.run.dir={tmp_path / 'run'}", capfd=capfd, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and message in proc.stderr


def test_an_error_before_a_device_is_chosen_writes_device_null(tmp_path, capfd):
    """A value the schema refuses at the run's start: summary.json has end_state error and a
    device of null (it was the string "None")."""
    proc = run_script("train.py", *TINY, "optimizer.lr=-0.1", f"hydra.run.dir={tmp_path}", capfd=capfd, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["end_state"] == "error" and summary["device"] is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_stopped_rank_ends_the_other_after_dist_timeout_s(small_root, tmp_path):
    """Two real gloo processes; rank 1 gets SIGSTOP mid-epoch; rank 0 gives up after the timeout."""
    run = tmp_path / "run"
    args = [*TINY, f"data.root={small_root}", "trainer.epochs=50", "trainer.log_every_n_steps=1"]
    args += ["loader.batch_size=4", "trainer.dist_timeout_s=4", f"hydra.run.dir={run}"]
    env = {**launch_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args],
            cwd=REPO,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        lines = []
        for line in procs[0].stdout:
            lines.append(line)
            if "epoch 0 3/" in line:
                break
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        out, err = procs[0].communicate(timeout=120)
        waited = time.monotonic() - stopped
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert procs[0].returncode == 2, "".join(lines)[-2000:] + out[-2000:] + err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "trainer.dist_timeout_s=4" in line and waited < 60
    assert read_json(run / "summary.json")["end_state"] == "collective timed out"


def test_a_write_that_hits_a_full_disk_ends_as_disk_full():
    """The mapping only: writing the checkpoint (and removing its temp file) is checkpoint.py's."""
    import errno

    from dali_train.ending import RunShape, ending_for

    shape = RunShape("resnet18", 256, 1, torch.device("cpu"))
    full = OSError(errno.ENOSPC, "No space left on device", "/run/checkpoints/.last.pt.tmp-1")
    assert ending_for(full, shape, 1800, training=True).state == "disk full"
    assert ending_for(ValueError("a bug"), shape, 1800, training=True) is None  # keeps its traceback


def test_a_timeout_without_a_process_group_is_not_blamed_on_the_other_ranks():
    """One process has no collective to time out: such a RuntimeError keeps its traceback (None),
    instead of the "collective timed out" line that names trainer.dist_timeout_s."""
    shape = RunShape("resnet18", 8, 1, torch.device("cpu"))
    assert not torch.distributed.is_initialized()
    assert ending_for(RuntimeError("socket read timed out"), shape, 1800, training=True) is None


def test_under_a_process_group_only_a_collectives_timeout_is_blamed_on_the_other_ranks():
    """Another error that says "timed out" (a CUDA launch, a file system) keeps its traceback; it
    was turned into the "collective timed out" line and its own text was lost. The collective's
    own timeout (gloo's words, as test_a_stopped_rank_ends_the_other_after_dist_timeout_s meets
    them for real) keeps that line, now with torch's text."""
    shape = RunShape("resnet18", 8, 1, torch.device("cpu"))
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        launch = RuntimeError("CUDA error: the launch timed out and was terminated")
        assert ending_for(launch, shape, 1800, training=True) is None
        gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 4000ms for recv operation")
        ending = ending_for(gloo, shape, 4, training=True)
        assert ending.state == "collective timed out" and "Timed out waiting 4000ms" in ending.message
        # gloo's other words for it, when the timeout closed the connection first (the test above met
        # them once in CI: "crashed" with a traceback, exit 1)
        closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Application timeout caused pair closure")
        assert ending_for(closed, shape, 4, training=True).state == "collective timed out"
    finally:
        torch.distributed.destroy_process_group()
