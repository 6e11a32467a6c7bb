"""MetricsWriter on resume: rows after the checkpoint go, earlier epochs stay (whatever the update
numbering), a line cut short goes, and TensorBoard hides the redone steps."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dali_train.distributed import DistInfo
from dali_train.logs import LineFormatter, MetricsWriter, setup_logging


def _write_rows(path: Path, rows: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resume_with_renumbered_updates_keeps_the_earlier_epochs_steps(tmp_path):
    # two epochs of 10 updates at one batch size; the resume's batch is doubled: epoch 2 starts at update 10
    _write_rows(tmp_path / "steps.jsonl", [{"epoch": (s - 1) // 10, "step": s} for s in range(2, 21, 2)])
    _write_rows(tmp_path / "metrics.jsonl", [{"epoch": 0, "wall_time_s": 5.0}, {"epoch": 1, "wall_time_s": 9.0}])
    writer = MetricsWriter(tmp_path, True)
    writer.drop_after(2, 10)
    assert [r["step"] for r in _rows(tmp_path / "steps.jsonl")] == list(range(2, 21, 2))
    assert writer.earlier_jobs_s == 9.0
    writer.close()


def test_rows_after_the_checkpoint_and_a_cut_line_are_dropped(tmp_path):
    steps = [{"epoch": 0, "step": s} for s in (2, 4, 6)] + [{"epoch": 1, "step": s} for s in (8, 10, 12)]
    _write_rows(tmp_path / "steps.jsonl", steps, tail='{"epoch": 1, "st')  # a kill mid-write
    _write_rows(tmp_path / "metrics.jsonl", [{"epoch": 0, "wall_time_s": 5.0}], tail='{"epoch": 1, "wall')
    writer = MetricsWriter(tmp_path, True)
    writer.drop_after(1, 10)  # mid-epoch checkpoint: epoch 1, update 10
    assert [r["step"] for r in _rows(tmp_path / "steps.jsonl")] == [2, 4, 6, 8, 10]
    assert [r["epoch"] for r in _rows(tmp_path / "metrics.jsonl")] == [0]
    writer.step({"train/loss": 1.0}, 11, 1)  # the resumed run appends whole lines after them
    writer.close()
    assert [r["step"] for r in _rows(tmp_path / "steps.jsonl")] == [2, 4, 6, 8, 10, 11]


def test_rows_inside_the_checkpoints_accumulation_window_are_dropped_by_loader_step(tmp_path):
    """Accumulation 3, a log row every 2 loader steps: the rows at loader steps 30 and 32 both
    carry update 10. last.pt at loader step 30 keeps the first; the second, logged after it and
    logged again by the resumed run, was kept too (a duplicate row)."""
    rows = [{"epoch": 1, "step": b // 3, "batch": b} for b in (26, 28, 30, 32, 34)]
    _write_rows(tmp_path / "steps.jsonl", [{"epoch": 0, "step": 3}, *rows])  # epoch 0's row: an older run's
    writer = MetricsWriter(tmp_path, True)
    writer.drop_after(1, 10, next_step=30)
    assert [r.get("batch") for r in _rows(tmp_path / "steps.jsonl")] == [None, 26, 28, 30]
    writer.close()


def _tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_tensorboard_hides_the_steps_a_resume_redoes(tmp_path):
    first = MetricsWriter(tmp_path, True)
    for step in (1, 2, 3):  # the kill came after update 3 was logged; last.pt holds update 2
        first.step({"train/loss": 1.0}, step, 0)
    first.close()
    time.sleep(1.1)  # TensorBoard reads event files in name order: the second they were made first
    resumed = MetricsWriter(tmp_path, True)
    resumed.drop_after(0, 2)
    for step in (3, 4):
        resumed.step({"train/loss": 0.5}, step, 0)
    resumed.close()
    assert _tensorboard_steps(tmp_path, "train/loss") == [1, 2, 3, 4]


def test_a_file_name_that_is_not_utf8_is_logged_escaped(tmp_path):
    """os.scandir gives such a name with surrogates, which a UTF-8 stream refuses: the line was lost
    to a logging error. The formatter of both handlers escapes it."""
    name = os.fsdecode(b"caf\xe9.JPEG")
    record = logging.makeLogRecord({"msg": "skipping %s", "args": (name,), "levelno": logging.WARNING})
    assert LineFormatter("%(message)s").format(record) == "skipping caf\\udce9.JPEG"
    root = logging.getLogger()
    saved = list(root.handlers)
    try:
        setup_logging(DistInfo(0, 0, 1), tmp_path)
        ours = [h for h in root.handlers if h not in saved]
        assert len(ours) == 2 and all(isinstance(h.formatter, LineFormatter) for h in ours)
    finally:
        for h in list(root.handlers):
            if h not in saved:
                root.removeHandler(h)
                h.close()
        for h in saved:
            if h not in root.handlers:
                root.addHandler(h)


def test_nan_and_inf_are_written_as_null_so_every_line_is_json(tmp_path):
    """A skipped non-finite loss (trainer.max_nonfinite_skips) and best top-1 -inf before any
    validation were written as bare NaN/-Infinity, which strict JSON readers refuse."""

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))

    writer = MetricsWriter(tmp_path, True)
    writer.step({"train/loss": float("nan"), "train/lr": 0.1}, global_step=1, epoch=0, batch=1)
    writer.epoch({"epoch": 0, "train_loss": float("inf"), "val_top1": None})
    writer.summary({"best_val_top1": float("-inf"), "per_rank": [1.0, float("nan")]})
    writer.close()
    assert strict((tmp_path / "steps.jsonl").read_text())["train/loss"] is None
    assert strict((tmp_path / "metrics.jsonl").read_text())["train_loss"] is None
    assert strict((tmp_path / "summary.json").read_text()) == {"best_val_top1": None, "per_rank": [1.0, None]}
