"""train.py end to end on real DALI CPU pipelines: `run(cfg)` in-process for training behavior;
`python train.py` and torchrun + gloo subprocesses where the CLI, exit codes or several processes
are the subject (SIGTERM and SIGKILL: test_resume)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, exit_code, read_json, run_inprocess, run_script, run_train
from tests.data.test_loaders import plant

SUMMARY_KEYS = {"val_top1", "val_top5", "best_val_top1", "val_samples", "epochs", "world_size", "train_img_s"}
EPOCH_KEYS = {"epoch", "train_loss", "val_loss", "val_top1", "val_top5", "train_img_s", "lr", "next_epoch_wait_s"}


@pytest.fixture(scope="module")
def one_epoch(sample_root, tmp_path_factory) -> Path:
    """One epoch on the sample set: the run dir (shared by the tests below)."""
    run = tmp_path_factory.mktemp("one_epoch") / "run"
    run_inprocess([*TINY, f"data.root={sample_root}", "trainer.epochs=1"], run)
    return run


def test_one_epoch_one_process_writes_every_output(one_epoch):
    run = one_epoch
    summary = read_json(run / "summary.json")
    assert SUMMARY_KEYS <= set(summary)
    assert summary["val_samples"] == 100 and summary["world_size"] == 1 and summary["epochs"] == 1
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and EPOCH_KEYS <= set(records[0])
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 25 // 2 + 1  # 400 files / batch 16 = 25 steps: every 2nd, and the last
    assert {"train/loss", "train/lr", "perf/img_per_s", "perf/data_wait_frac"} <= set(steps[0])
    assert 0 <= steps[-1]["perf/data_wait_frac"] <= 1 and steps[-1]["step"] == 25
    assert (run / "train.log").is_file()  # .hydra/config.yaml is Hydra's: the CLI test below
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert state["next_epoch"] == 1 and state["model_name"] == "test_resnet"
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])
    assert (run / "checkpoints" / "best.pt").is_file()


@pytest.mark.slow
def test_two_processes_share_one_run_dir_count_val_exactly_and_validate_what_they_save(small_root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    good = next(data.glob("train/*/*.JPEG")).read_bytes()
    (data / "train" / "n00000003" / "truncated.JPEG").write_bytes(good[: len(good) // 2])
    (data / "val" / "n00000007" / "zero.JPEG").write_bytes(b"")
    # with an EMA that tracks each rank's BatchNorm statistics closely (its warmup), so the ranks' differ
    args = [*TINY, f"data.root={data}", "trainer.epochs=1", "loader.batch_size=8", "trainer.ema=true"]
    proc = run_train([*args, "trainer.ema_warmup=true"], nproc=2, cwd=tmp_path)
    assert "skipping" in proc.stdout and "truncated.JPEG" in proc.stdout and "zero.JPEG" in proc.stdout
    run_dirs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    summary = read_json(run_dirs[0] / "summary.json")
    assert summary["world_size"] == 2 and summary["val_samples"] == 50  # the zero-byte file is skipped
    assert summary["global_batch"] == 16
    # what the two ranks validated is the model they saved: one process evaluating last.pt agrees
    last = run_dirs[0] / "checkpoints" / "last.pt"
    alone = run_inprocess([*args, "trainer.eval_only=true", f"trainer.resume={last}"], tmp_path / "eval")
    assert alone.summary["val_samples"] == 50
    assert alone.summary["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_ranks_whose_copies_of_the_data_differ_stop_before_training_in_one_line(small_root, tmp_path):
    """Per-node copies, one missing a val file: each rank sharded its own list, so one val image
    was counted twice and one never, and train files were read twice or not at all, silently.
    Identical copies at other paths, with the same bad file, train as one."""
    for rank in (0, 1):
        shutil.copytree(small_root, tmp_path / "nodes" / str(rank))
        good = sorted((tmp_path / "nodes" / str(rank) / "train").glob("*/*.JPEG"))[0]
        good.write_bytes(good.read_bytes()[:500])  # the same cut file in both: skipped by both, not a difference
    root = f"data.root={tmp_path / 'nodes'}/${{oc.env:LOCAL_RANK}}"
    args = [*TINY, root, "trainer.epochs=1", "loader.batch_size=8"]
    same = run_train([*args, f"hydra.run.dir={tmp_path / 'same'}"], nproc=2, cwd=tmp_path, check=False)
    assert same.returncode == 0 and read_json(tmp_path / "same" / "summary.json")["end_state"] == "completed", same.stderr[-2000:]
    missing = sorted((tmp_path / "nodes" / "1" / "val").glob("*/*.JPEG"))[0]
    missing.unlink()
    proc = run_train(args, nproc=2, cwd=tmp_path, check=False)
    assert proc.returncode != 0 and not list(tmp_path.glob("outputs/*/*/metrics.jsonl")), proc.stdout[-2000:]
    train, val = (len(list((tmp_path / "nodes" / "0" / split).glob("*/*.JPEG"))) for split in ("train", "val"))
    train -= 1  # the cut one
    expected = f"the ranks list different files (rank 0: {train} train / {val} val; rank 1: {train} train / {val - 1} val)"
    assert expected in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_an_error_on_rank_1_is_what_rank_0_reports(small_root, tmp_path):
    """Rank 1 cannot decode its files (its copy has the same names, every train JPEG damaged):
    rank 0, which writes summary.json, saw only its collective fail ("Connection closed by peer")
    and recorded a crash with a traceback and exit 1. It now says rank 1's cause, exit 2."""
    for rank in (0, 1):
        shutil.copytree(small_root, tmp_path / "nodes" / str(rank))
    for path in (tmp_path / "nodes" / "1" / "train").glob("*/*.JPEG"):
        plant(str(path))
    root = f"data.root={tmp_path / 'nodes'}/${{oc.env:LOCAL_RANK}}"
    run = tmp_path / "run"
    args = [*TINY, root, "trainer.epochs=1", "loader.batch_size=8", "data.verify_files=false", f"hydra.run.dir={run}"]
    proc = run_train(args, nproc=2, cwd=tmp_path, check=False)
    summary = read_json(run / "summary.json")
    assert summary["end_state"] == "bad file" and summary["end_message"].startswith("rank 1: DALI could not decode ")
    assert "[rank0]: Traceback" not in proc.stderr and "crashed" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_resume_continues_at_the_next_epoch(small_root, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    run_inprocess([*TINY, f"data.root={small_root}", "trainer.epochs=1"], first)
    resumed = run_inprocess(
        [*TINY, f"data.root={small_root}", "trainer.epochs=2", f"trainer.resume={first / 'checkpoints' / 'last.pt'}"],
        second,
    )
    assert "resumed from" in resumed.log and "at epoch 1" in resumed.log
    records = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["optimizer=sgd", "optimizer=ranger", "optimizer=muon"])  # ranger: Lookahead's sync counter; muon: the 5-epoch recipe's
def test_resume_equals_an_uninterrupted_run(small_root, tmp_path, optimizer):
    common = [*TINY, f"data.root={small_root}", "trainer.deterministic=true", "loader.batch_size=8", optimizer]
    straight, half, rest = tmp_path / "straight", tmp_path / "half", tmp_path / "rest"
    run_inprocess([*common, "trainer.epochs=2"], straight)
    run_inprocess([*common, "trainer.epochs=2", "trainer.epochs_per_job=1"], half)
    run_inprocess([*common, "trainer.epochs=2", f"trainer.resume={half / 'checkpoints' / 'last.pt'}"], rest)
    a = torch.load(straight / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    b = torch.load(rest / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"]
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=1e-6, msg=f"{k} differs after resume")


@pytest.fixture
def bad_roots(sample_root, tmp_path) -> dict[str, Path]:
    """Folders that are no dataset: empty, without val/, with an empty class folder."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "nosplit" / "train" / "a").mkdir(parents=True)
    (tmp_path / "nosplit" / "train" / "a" / "x.JPEG").write_bytes(next(sample_root.glob("train/*/*.JPEG")).read_bytes())
    (tmp_path / "emptyclass" / "train" / "a").mkdir(parents=True)
    (tmp_path / "emptyclass" / "val" / "a").mkdir(parents=True)
    return {
        "empty": tmp_path / "empty",
        "nosplit": tmp_path / "nosplit",
        "emptyclass": tmp_path / "emptyclass",
        "sample": sample_root,
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["data=imagenet", "data.root=/nonexistent/imagenet"], "data.root=/nonexistent/imagenet: no such folder"),
        (["data=imagenet", "data.root={empty}"], "the folder is empty"),
        (["data=imagenet", "data.root={nosplit}"], "not a folder"),
        (["data=imagenet", "data.root={emptyclass}"], "class folder has no images"),
        (
            ["trainer.resume=/nonexistent/last.pt", "data.root={sample}"],
            "trainer.resume=/nonexistent/last.pt: no such file",
        ),
        (["model.name=resnet_nonexistent", "data.root={sample}"], "not a timm model"),
        (["trainer.amp=fp8", "data.root={sample}"], "trainer.amp=fp8: unknown; choose one of"),
        (["trainer.val_every_n_epochs=0", "data.root={sample}"], "trainer.val_every_n_epochs=0"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(bad_roots, tmp_path, args, message):
    """In-process: the exception main turns into exit code 2 and `error: <its text>` (the next test
    runs that path as a subprocess)."""
    args = [a.format(**bad_roots) for a in args]
    ended = run_inprocess([*TINY, *args], tmp_path / "run", check=False)
    assert exit_code(ended.ended) == 2, ended.log[-2000:]
    assert "Traceback" not in ended.log
    assert "\n" not in str(ended.ended) and message in str(ended.ended), str(ended.ended)


@pytest.mark.parametrize("layout", ["missing", "empty", "train_only"])
def test_a_data_root_under_the_sample_preset_is_refused_and_never_generated_into(sample_root, tmp_path, layout):
    """data.root without data=imagenet keeps the default preset, data=sample: a folder that is no dataset
    yet (a typo, an unmounted disk, ImageNet before its val/) is one line naming data=imagenet and stays as
    it was. The demo set used to be generated there and trained on, ending "completed"."""
    root = tmp_path / "imagenet"
    if layout != "missing":
        root.mkdir()
    if layout == "train_only":
        shutil.copytree(next(sample_root.glob("train/*")), root / "train" / "n0")
    before = sorted(root.rglob("*")) if root.exists() else None
    ended = run_inprocess([*TINY, f"data.root={root}"], tmp_path / "run", check=False)
    assert exit_code(ended.ended) == 2, ended.log[-2000:]
    message = str(ended.ended)
    assert "\n" not in message and f"data.root={root}: no val/ folder" in message, message
    assert f"use data=imagenet data.root={root}" in message, message
    assert (sorted(root.rglob("*")) if root.exists() else None) == before


def test_the_sample_preset_generates_its_set_in_the_launch_directory(tmp_path, monkeypatch):
    """The demo's path: data=sample's own folder is generated when absent, and read as it is after."""
    from dali_train.config import sample_cache_root
    from dali_train.data import prepare_sample_data
    from dali_train.distributed import DistInfo

    monkeypatch.chdir(tmp_path)
    root = Path(sample_cache_root())
    assert root == tmp_path / ".cache" / "sample-v1"
    prepare_sample_data(str(root), DistInfo(0, 0, 1))
    jpegs = sorted(root.rglob("*.JPEG"))
    assert len(list(root.glob("val/*/*.JPEG"))) == 100 and len(jpegs) == 500
    stamps = [p.stat().st_mtime_ns for p in jpegs]
    prepare_sample_data(str(root), DistInfo(0, 0, 1))  # present: not made again
    assert [p.stat().st_mtime_ns for p in jpegs] == stamps


def test_a_user_error_is_one_stderr_line_and_exit_code_2(tmp_path, capfd):
    """`python train.py` with a bad data.root (in this process; a real interpreter's exit 2 and
    `error:` line: test_run_end's stopped-rank test): main prints the one line and exits 2; Hydra
    has written the composed config into the run dir before the run started."""
    args = ["data=imagenet", "data.root=/nonexistent/imagenet", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_script("train.py", *TINY, *args, capfd=capfd, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    message = "data.root=/nonexistent/imagenet: no such folder"
    assert len(error_lines) == 1 and message in error_lines[0], proc.stderr[-2000:]
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow
def test_ema_mixup_cutmix_label_smoothing_grad_accum(sample_root, tmp_path):
    run = tmp_path / "run"
    run_inprocess(
        [
            *TINY,
            f"data.root={sample_root}",
            "trainer.epochs=1",
            "trainer.ema=true",
            "trainer.ema_decay=0.9",
            "trainer.mixup_alpha=0.2",
            "trainer.cutmix_alpha=1.0",
            "trainer.label_smoothing=0.1",
            "trainer.grad_accum_steps=2",
            "trainer.clip_grad_norm=5.0",
            "optimizer=adamw",
            "optimizer.lr=1e-3",
        ],
        run,
    )
    summary = read_json(run / "summary.json")
    assert summary["val_samples"] == 100 and summary["global_batch"] == 32
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert state["model_ema"] is not None and state["global_step"] == 13  # 25 micro-batches -> 13 updates
    assert any(
        not torch.equal(state["model_ema"][k], state["model"][k]) for k in state["model"] if k.endswith("weight")
    )


def test_val_every_n_epochs_counts_from_epoch_0_and_validates_each_jobs_last(small_root, tmp_path):
    """5 epochs, every 2nd validated, in jobs of 3: epochs 1 and 3 by the count (absolute, not per
    job), 2 as the first job's last, 4 as the run's last; epoch 0 is not validated."""
    run_dir = tmp_path / "run"
    common = [*TINY, f"data.root={small_root}", "trainer.epochs=5", "trainer.val_every_n_epochs=2"]
    first = run_inprocess([*common, "trainer.epochs_per_job=3"], run_dir)
    second = run_inprocess([*common, "trainer.resume=auto"], run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3, 4] and first.summary["epochs_completed"] == 3
    assert first.summary["end_state"] == "job done" and second.summary["end_state"] == "completed"
    # the next job's command names this dir: a plain rerun gets a new one and would start over
    assert first.summary["end_message"].endswith(f"the same command with trainer.resume=auto hydra.run.dir={run_dir}")
    assert rows[0]["val_top1"] is None and rows[0]["val_samples"] is None
    assert [r["val_samples"] for r in rows[1:]] == [50, 50, 50, 50]
    assert "not validated (trainer.val_every_n_epochs)" in first.log
    assert "not validated" not in second.log
    best = max(reversed(rows[1:]), key=lambda r: r["val_top1"])  # best.pt is kept on >=: the later of a tie
    assert second.summary["best_val_top1"] == best["val_top1"] and second.summary["val_top1"] == rows[4]["val_top1"]
    state = torch.load(run_dir / "checkpoints" / "best.pt", map_location="cpu", weights_only=True)
    assert state["next_epoch"] == best["epoch"] + 1  # best.pt is only ever a validated epoch


def test_eval_only_and_a_checkpoint_of_another_model(sample_root, one_epoch, tmp_path):
    run = one_epoch
    last = run / "checkpoints" / "last.pt"
    ev = tmp_path / "eval"
    run_inprocess([*TINY, f"data.root={sample_root}", "trainer.eval_only=true", f"trainer.resume={last}"], ev)
    assert read_json(ev / "summary.json")["val_top1"] == read_json(run / "summary.json")["val_top1"]
    other = run_inprocess(
        [*TINY, f"data.root={sample_root}", "model.name=resnet50", f"trainer.resume={last}"], tmp_path / "other", check=False
    )
    assert exit_code(other.ended) == 2 and "checkpoint is of model test_resnet, this run builds resnet50" in str(
        other.ended
    )


@pytest.mark.slow
def test_demo_learns_the_sample_set(sample_root, tmp_path):
    """The sample set's class signal is learnable: well above the 10% of chance after one epoch of
    the demo's settings (71% top-1 measured; 87% after a second epoch, 95% after a third)."""
    demo = run_inprocess(["trainer.device=cpu", f"data.root={sample_root}", "trainer.epochs=1"], tmp_path / "run")
    assert demo.summary["best_val_top1"] > 50.0


def test_an_undecodable_file_mid_epoch_saves_progress_and_names_the_file(small_root, tmp_path):
    """With the startup check off, a JPEG with broken headers reaches DALI, which stops its
    pipeline: the run keeps its last completed step, exits with one line naming the file, and
    resumes once the file is excluded."""
    data = tmp_path / "data"
    shutil.copytree(small_root, data)
    good = next(data.glob("train/*/*.JPEG")).read_bytes()
    bad = data / "train" / "n00000004" / "broken.JPEG"
    bad.write_bytes(good[:20] + bytes(180) + good[200:])
    run = tmp_path / "run"
    args = [*TINY, f"data.root={data}", "trainer.epochs=1", "loader.batch_size=8", "data.verify_files=false"]
    stopped = run_inprocess(args, run, check=False)
    assert exit_code(stopped.ended) == 2 and "Traceback" not in stopped.log, stopped.log[-3000:]
    error = str(stopped.ended)
    assert "\n" not in error and str(bad) in error and "data.exclude_list" in error
    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert state["next_epoch"] == 0
    exclude = tmp_path / "exclude.txt"
    exclude.write_text("train/n00000004/broken.JPEG\n")
    resumed = run_inprocess([*args, f"data.exclude_list={exclude}", "trainer.resume=auto"], run)
    assert f"at epoch 0 step {state['next_step']}" in resumed.log
    assert "the rest of epoch 0 follows a new order" in resumed.log  # one file fewer: said, not silent
    assert read_json(run / "summary.json")["val_samples"] == 50


def test_model_pretrained_starts_from_the_weights_of_a_checkpoint(sample_root, one_epoch, tmp_path):
    """model.pretrained=best.pt of another run (no EMA there: its model weights), evaluated without
    training: the val top-1 of that run, so its weights reached the model; then one training step."""
    best = one_epoch / "checkpoints" / "best.pt"
    args = [*TINY, f"data.root={sample_root}", f"model.pretrained={best}"]
    ev = run_inprocess([*args, "trainer.eval_only=true"], tmp_path / "eval")
    assert ev.summary["val_top1"] == read_json(one_epoch / "summary.json")["best_val_top1"]
    assert f"tensors loaded from {best}" in ev.log
    fine_tuned = run_inprocess([*args, "trainer.epochs=1", "trainer.max_steps_per_epoch=1"], tmp_path / "tune")
    assert fine_tuned.summary["epochs_completed"] == 1 and f"tensors loaded from {best}" in fine_tuned.log


@pytest.mark.slow
def test_sync_bn_on_cpu_under_gloo_is_refused_or_ignored_in_one_line(small_root, tmp_path):
    """torch's DDP takes SyncBatchNorm on GPU modules only: with trainer.device=cpu under torchrun,
    trainer.sync_bn=true must end in one `error:` line naming it (exit 2), or train with a warning
    naming it, never DDP's ValueError with a traceback."""
    run = tmp_path / "run"
    args = [*TINY, f"data.root={small_root}", "trainer.epochs=1", "trainer.max_steps_per_epoch=2"]
    proc = run_train(
        [*args, "loader.batch_size=8", "trainer.sync_bn=true", f"hydra.run.dir={run}"], nproc=2, check=False
    )
    if proc.returncode == 0:
        assert "trainer.sync_bn" in proc.stdout and read_json(run / "summary.json")["world_size"] == 2
        return
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    # torchrun reports a failed child with a traceback of its own; the ranks' exit code is ours
    assert "exitcode: 2" in proc.stderr and "ValueError" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 2 and len(set(errors)) == 1 and "trainer.sync_bn" in errors[0], errors
