"""Logging on rank 0: console and file logs, TensorBoard, metrics.jsonl, a progress display.

The writer decides about rank: rank 0 gets real outputs, the other ranks no-ops, so the engine
never checks which rank it is on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from dali_train.distributed import DistInfo


class LineFormatter(logging.Formatter):
    """A file name that is not UTF-8 (os.fsdecode's surrogates) as `\\udcXX` escapes: as it was,
    the line was lost to a "--- Logging error ---" traceback on stdout and in train.log."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).encode("utf-8", "backslashreplace").decode("utf-8")


def json_text(record: dict[str, Any], indent: int | None = None) -> str:
    """JSON with NaN/inf as null: json.dumps writes them as bare NaN/Infinity, which is not JSON (a
    skipped non-finite loss, or best top-1 -inf before any validation, broke strict readers)."""

    def finite(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [finite(x) for x in v]
        return v

    return json.dumps(finite(record), indent=indent, allow_nan=False)


def setup_logging(dist: DistInfo, run_dir: Path | None) -> None:
    """Rank 0: INFO to the console and to run_dir/train.log; others: WARNING+, prefixed."""
    root = logging.getLogger()
    for h in list(root.handlers):  # Hydra's, or the previous multirun job's: ours replace them
        root.removeHandler(h)
        h.close()
    prefix = "" if dist.is_main else f"[rank {dist.rank}] "
    fmt = LineFormatter(f"%(asctime)s {prefix}%(levelname).1s %(name)s: %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    root.addHandler(console)
    if dist.is_main and run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        file = logging.FileHandler(run_dir / "train.log")
        file.setFormatter(fmt)
        root.addHandler(file)
    root.setLevel(logging.INFO if dist.is_main else logging.WARNING)
    for noisy in ("PIL", "matplotlib", "torch._dynamo", "torch._inductor"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class MetricsWriter:
    """TensorBoard scalars, metrics.jsonl (one line per epoch) and steps.jsonl (one line per log
    interval); a no-op except on rank 0."""

    def __init__(self, run_dir: Path, enabled: bool, summary_name: str = "summary.json") -> None:
        self.enabled, self.run_dir, self.summary_name = enabled, run_dir, summary_name
        self.started = time.perf_counter()  # metrics.jsonl's wall_time_s: time to accuracy
        self.earlier_jobs_s = 0.0  # a resumed run's time up to its checkpoint (set by drop_after)
        self._purge_step: int | None = None  # set by drop_after: TensorBoard hides older events from it on
        self._writer = None  # TensorBoard's, opened on first use (after drop_after)
        self._steps = None  # steps.jsonl, opened on first use

    @property
    def _tb(self):
        if self._writer is None and self.enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=self._purge_step)
        return self._writer

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self._tb is not None:
            for tag, v in values.items():
                if v is not None and math.isfinite(v):
                    self._tb.add_scalar(tag, v, step)

    def step(self, values: dict[str, float], global_step: int, epoch: int, batch: int | None = None) -> None:
        """Per-log-interval values: TensorBoard scalars and one line of steps.jsonl (`batch`: the
        loader steps of the epoch done, which tell rows apart within an update's accumulation)."""
        self.scalars(values, global_step)
        if self.enabled:
            if self._steps is None:
                self._steps = open(self.run_dir / "steps.jsonl", "a")
            where = {"epoch": epoch, "step": global_step} | ({"batch": batch} if batch is not None else {})
            self._steps.write(json_text(where | values) + "\n")
            self._steps.flush()  # a killed run keeps every interval it logged

    def run_time_s(self) -> float:
        """Seconds since the run started, over all its jobs (as metrics.jsonl's wall_time_s)."""
        return self.earlier_jobs_s + time.perf_counter() - self.started

    def drop_after(self, next_epoch: int, global_step: int, next_step: int = 0) -> None:
        """On resume in the same run dir: drop the rows of work after the checkpoint (a kill between
        a log row and last.pt), which the resumed run logs again, and a line cut short by a kill or a
        full disk; TensorBoard hides its points after the checkpoint too. wall_time_s then goes on
        from the last kept epoch's; train.py sets it to the checkpoint's own time where that is saved
        (so the part of an epoch before a mid-epoch save counts; the time between jobs does not).
        Rows are matched by epoch first: a resume with another batch size renumbers the updates; then
        by loader step (`next_step` done in `next_epoch`), as rows logged inside one update's
        accumulation share its number; rows without one (older runs) by update."""
        if not self.enabled:
            return
        log = logging.getLogger("dali_train")
        renumbered = False
        for name in ("metrics.jsonl", "steps.jsonl"):
            path = self.run_dir / name
            if not path.is_file():
                continue
            lines = [line for line in path.read_text().splitlines(keepends=True) if line.strip()]
            kept, cut = [], 0
            for line in lines:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # only a last line can be cut short
                    cut += 1
                    continue
                if row["epoch"] < next_epoch or (
                    name == "steps.jsonl"
                    and row["epoch"] == next_epoch
                    and (row["batch"] <= next_step if "batch" in row else row["step"] <= global_step)
                ):
                    kept.append(line if line.endswith("\n") else line + "\n")
                    renumbered |= name == "steps.jsonl" and row["step"] > global_step
            if name == "metrics.jsonl" and kept:
                self.earlier_jobs_s = json.loads(kept[-1]).get("wall_time_s") or 0.0
            dropped = len(lines) - cut - len(kept)
            if cut or dropped:
                path.write_text("".join(kept))
            if cut:
                log.warning("%s: dropped %d line(s) cut short (a kill or a full disk while writing)", path, cut)
            if dropped:
                log.info("dropped %d rows of %s logged after the checkpoint", dropped, name)
        # TensorBoard hides events from a step on; with renumbered updates, that would hide kept epochs too
        self._purge_step = None if renumbered else global_step + 1

    def epoch(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json_text(record) + "\n")
            if self._writer is not None:
                self._writer.flush()

    def log_epoch(
        self,
        epoch: int,
        stats: Any,
        metrics: dict[str, float] | None,
        lr: float,
        global_step: int,
        next_wait_s: float | None,
    ) -> None:
        """One epoch's line in metrics.jsonl, its TensorBoard points and its summary log line.
        `metrics`: the epoch's validation, None when it was not validated (its val fields are null).
        `next_wait_s`: how long (on rank 0) the next epoch's pipeline build outlasted validation (on
        an unvalidated epoch: the whole build); None when this job builds no next epoch."""
        val = metrics or {}
        self.epoch(
            {
                "epoch": epoch,
                "train_loss": stats.loss,
                "val_loss": val.get("loss"),
                "val_top1": val.get("top1"),
                "val_top5": val.get("top5"),
                "val_top1_no_tta": val.get("top1_no_tta"),  # null unless trainer.val_flip_tta
                "val_samples": val.get("samples"),
                "train_img_s": stats.img_per_s,
                "data_wait_frac": stats.data_wait_frac,
                "lr": lr,
                "next_epoch_wait_s": next_wait_s,
                "wall_time_s": self.run_time_s(),  # since the run started
            }
        )
        points = {"train/epoch_loss": stats.loss}
        if metrics is not None:
            points.update({"val/top1": metrics["top1"], "val/top5": metrics["top5"], "val/loss": metrics["loss"]})
            if metrics.get("top1_no_tta") is not None:
                points["val/top1_no_tta"] = metrics["top1_no_tta"]
        self.scalars(points, global_step)
        if metrics is None:
            shown = "not validated (trainer.val_every_n_epochs)"
        else:
            shown = "val loss {loss:.4f} top-1 {top1:.2f} top-5 {top5:.2f} ({samples} images)".format(**metrics)
        logging.getLogger("dali_train").info(
            "epoch %d: train loss %.4f | %s | %.0f img/s, data wait %.1f%%",
            epoch,
            stats.loss,
            shown,
            stats.img_per_s,
            100 * stats.data_wait_frac,
        )

    def summary(self, record: dict[str, Any]) -> None:
        if self.enabled:
            tmp = self.run_dir / f".{self.summary_name}.tmp"
            with open(tmp, "w") as f:  # synced before the rename: a machine crash leaves the old one, not an empty one
                f.write(json_text(record, indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.run_dir / self.summary_name)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._steps is not None:
            self._steps.close()


class Progress:
    """Per-step progress on rank 0: a tqdm bar on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total, self.desc, self.start = total, desc, time.perf_counter()
        self.enabled = enabled
        self._bar = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, dynamic_ncols=True, leave=False)
        self._done = 0

    def update(self, done: int, **fields: float) -> None:
        """Called at log intervals only (the values come from a host sync)."""
        if not self.enabled:
            return
        text = " ".join(f"{k} {v:.4g}" for k, v in fields.items())
        if self._bar is not None:
            self._bar.update(done - self._done)
            self._bar.set_postfix_str(text)
        else:
            elapsed = time.perf_counter() - self.start
            eta = elapsed / max(done, 1) * (self.total - done)
            logging.getLogger("dali_train.progress").info(
                "%s %d/%d [%s<%s] %s", self.desc, done, self.total, _hms(elapsed), _hms(eta), text
            )
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def input_bound_verdict(data_wait_frac: float, loader_name: str) -> str:
    """One sentence for the end of a run: was the model starved by the loader?"""
    if data_wait_frac <= 0.10:
        return f"not input-bound: the loader kept up (data wait {data_wait_frac:.1%} of step time)"
    hint = {
        "pytorch": "switch to loader=dali (GPU decode) or raise loader.num_workers",
        "dali_cpu": "switch to loader=dali (GPU decode) or raise loader.num_threads",
        "dali": "raise loader.num_threads or loader.hw_decoder_load, or let scripts/benchmark.py --tune choose "
        "(the wait includes the host waiting behind the GPU's queued steps: judge a change by img/s)",
    }.get(loader_name, "check the storage read speed")
    return f"input-bound: {data_wait_frac:.1%} of step time waited on loader={loader_name}; {hint}"
