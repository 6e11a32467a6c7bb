"""The epochs of a run: train, validate (the next epoch's pipeline building behind it), log,
checkpoint, and how the run ends. train.py builds the parts, restores them and hands them over,
with the typed trainer config; nothing here sees the whole config.

Per epoch, in this order: train; validate while the next epoch builds; the metrics row; best.pt;
last.pt; a stop requested by a signal. A kill between any two steps leaves a run that resumes:
last.pt never claims an epoch whose row is missing (docs/reliability.md).
"""

from __future__ import annotations

import json
import logging
import signal
from dataclasses import dataclass, field

from timm.utils import distribute_bn

from dali_train.checkpoint import Checkpointer, CheckpointWriteError
from dali_train.config import TrainerConfig
from dali_train.data import DatasetError, Loaders, NextEpoch
from dali_train.distributed import DistInfo, StopFlag
from dali_train.divergence import Diverged, nonfinite_tensors
from dali_train.ending import COMPLETED, Ending, job_done, stopped_by_signal
from dali_train.engine import EpochStats, LoopControl, TrainParts, train_one_epoch
from dali_train.evaluate import evaluate
from dali_train.logs import MetricsWriter, input_bound_verdict

log = logging.getLogger("dali_train")


@dataclass
class Fit:
    """The run's epochs from a (restored) position; `run` returns how they ended. `summary` is
    summary.json's dict, updated as epochs complete (the caller writes it, whatever the ending)."""

    parts: TrainParts
    loaders: Loaders
    checkpointer: Checkpointer
    writer: MetricsWriter
    stop: StopFlag
    trainer: TrainerConfig
    loader_name: str  # for the end-of-run verdict on the input pipeline
    summary: dict
    best_top1: float = float("-inf")
    saved_at: int = field(init=False)  # the update that last.pt (or the resumed file) holds

    def __post_init__(self) -> None:
        self.saved_at = self.parts.global_step
        self.dist: DistInfo = self.parts.dist
        self.last_pt = self.checkpointer.path("last.pt")
        ema = self.parts.ema
        self.eval_model = ema.module if ema is not None else self.parts.model  # best is tracked on EMA when on

    def average_ema_bn_stats(self) -> None:
        """Each rank's EMA averages its own BatchNorm statistics: replace them by their mean over
        the ranks (timm's distribute_bn), so that all validate, and rank 0 saves, one model."""
        if self.parts.ema is not None and self.dist.enabled:
            distribute_bn(self.parts.ema.module, self.dist.world_size, reduce=True)

    def save(self, name: str, epoch: int, step: int) -> None:
        p = self.parts
        self.average_ema_bn_stats()  # rank 0 saves the EMA the ranks validate
        if nonfinite_tensors([p.model, p.ema], self.dist):  # never NaN weights over a good checkpoint
            raise Diverged(
                f"the weights became NaN/inf by update {p.global_step} (epoch {epoch} step {step}); "
                f"{name} keeps update {self.saved_at}; lower optimizer.lr or set trainer.clip_grad_norm",
                p.global_step,
            )
        self.checkpointer.save(
            name, p, next_epoch=epoch, next_step=step, best_top1=self.best_top1, wall_time_s=self.writer.run_time_s()
        )
        self.saved_at = p.global_step

    def validate(self) -> dict:
        self.average_ema_bn_stats()
        return evaluate(
            self.eval_model,
            self.loaders.val,
            device=self.parts.device,
            dist=self.dist,
            amp_dtype=self.parts.amp_dtype,
            max_steps=self.trainer.max_val_steps,
            flip_tta=self.trainer.val_flip_tta,
        )

    def signal_ending(self, where: str) -> Ending:
        signum = self.stop.signal or signal.SIGTERM
        return stopped_by_signal(signum, f"signal {signum} {where}; saved {self.last_pt}", self.stop.hand_over)

    def save_progress_before(self, epoch: int, step: int) -> None:
        """A loader failed mid-epoch, or validation failed: keep what was trained, where that is safe
        (one process: with several ranks the others may sit in a collective, so the last periodic save
        stands). A save the disk refuses is logged: the failure that brought us here is the one raised."""
        if not self.dist.enabled and self.parts.global_step != self.saved_at:
            try:
                self.save("last.pt", epoch, step)
            except (OSError, CheckpointWriteError) as e:  # a full disk, say: the failure that brought us here is raised
                log.error("could not save %s before stopping: %s", self.last_pt, e)
                return
            log.warning("saved %s at epoch %d step %d before stopping", self.last_pt, epoch, step)

    def run(self, start_epoch: int, start_step: int) -> Ending:
        tc, p, loaders, summary = self.trainer, self.parts, self.loaders, self.summary
        ctl = LoopControl(
            writer=self.writer,
            log_every=tc.log_every_n_steps,
            max_steps=tc.max_steps_per_epoch,
            save_every=tc.save_every_n_steps,
            save=lambda e, s: self.save("last.pt", e, s),
            stop=self.stop,
            max_nonfinite_skips=tc.max_nonfinite_skips,
        )
        epoch_stats: list[EpochStats] = []
        metrics: dict = {}
        summary["epochs_completed"] = start_epoch
        end_epoch = tc.epochs if tc.epochs_per_job is None else min(tc.epochs, start_epoch + tc.epochs_per_job)
        for epoch in range(start_epoch, start_epoch if tc.eval_only else end_epoch):
            updates_before = p.global_step
            try:
                loaders.train.set_epoch(epoch, start_step)
                stats = train_one_epoch(p, loaders.train, ctl, epoch=epoch, start_step=start_step)
            except DatasetError:  # a file the startup check let through; keep what was trained
                self.save_progress_before(epoch, start_step + (p.global_step - updates_before) * tc.grad_accum_steps)
                raise
            if stats.interrupted:
                self.save("last.pt", epoch, start_step + stats.steps)
                return self.signal_ending(f"at epoch {epoch} step {start_step + stats.steps}")
            start_step = 0
            # The next epoch's pipeline builds and prefetches during validation, on a thread. Its
            # error (a DatasetError in its first batches, or any other) is raised once this epoch is saved.
            next_epoch = NextEpoch(loaders.train, epoch + 1, p.device) if epoch + 1 < end_epoch else None
            epoch_metrics = None  # None: this epoch is not validated (trainer.val_every_n_epochs)
            validated = False
            try:
                if (epoch + 1) % tc.val_every_n_epochs == 0 or epoch + 1 == end_epoch:
                    metrics = epoch_metrics = self.validate()
                validated = True
            except Exception:  # a bad val file, memory at the val side...: the epoch's training is complete, keep it
                self.save_progress_before(epoch + 1, 0)
                raise
            finally:
                next_epoch_error = next_epoch.join() if next_epoch is not None else None
                if next_epoch_error is not None and not validated:  # validation's own error goes up; say this one
                    log.warning("the next epoch's pipeline failed too: %r", next_epoch_error)
            if epoch_metrics is not None:
                self.best_top1 = max(self.best_top1, epoch_metrics["top1"])
            summary.update(best_val_top1=self.best_top1, epochs_completed=epoch + 1)
            epoch_stats.append(stats)
            # The log row first, last.pt last: a kill in between leaves a checkpoint that claims no
            # epoch without its row; the resume redoes the epoch and replaces the rows after it.
            wait_s = next_epoch.waited_s if next_epoch is not None else None
            self.writer.log_epoch(epoch, stats, epoch_metrics, stats.lr, p.global_step, wait_s)
            if epoch_metrics is not None and epoch_metrics["top1"] >= self.best_top1:
                self.save("best.pt", epoch + 1, 0)
            self.save("last.pt", epoch + 1, 0)
            if next_epoch_error is not None:
                raise next_epoch_error
            if epoch + 1 < end_epoch and self.stop.requested(self.dist, p.device, sync_point=True):
                return self.signal_ending(f"after epoch {epoch}")

        if not epoch_stats:  # eval_only, or resumed after the last epoch
            metrics = self.validate()
            self.best_top1 = max(self.best_top1, metrics["top1"])
        return self._finish(metrics, epoch_stats, end_epoch)

    def _earlier_summary(self) -> dict:
        """This run dir's summary.json as an earlier job left it; {} if none or unreadable (a crash mid-write)."""
        try:
            return json.loads((self.checkpointer.dir.parent / "summary.json").read_text())
        except (OSError, ValueError):
            return {}

    def _finish(self, metrics: dict, epoch_stats: list[EpochStats], end_epoch: int) -> Ending:
        """The summary's final figures and the run's last line: completed, or this job's share done."""
        tc = self.trainer
        if metrics["samples"] != self.loaders.num_val_files and tc.max_val_steps is None:
            log.warning(
                "validation saw %d images, the val split has %d", metrics["samples"], self.loaders.num_val_files
            )
        if epoch_stats:
            img_s = sum(s.img_per_s for s in epoch_stats) / len(epoch_stats)
            wait = sum(s.data_wait_frac for s in epoch_stats) / len(epoch_stats)  # each: the max over ranks
        else:  # eval only: none; a finished run resumed: its own (0.0 would say it never trained)
            ran = {} if tc.eval_only else self._earlier_summary()
            img_s, wait = ran.get("train_img_s"), ran.get("data_wait_frac")
        self.summary.update(
            val_top1=metrics["top1"],
            val_top5=metrics["top5"],
            val_top1_no_tta=metrics["top1_no_tta"],
            val_loss=metrics["loss"],
            best_val_top1=self.best_top1,
            val_samples=metrics["samples"],
            train_img_s=img_s,
            data_wait_frac=wait,
        )
        ending = job_done(end_epoch, tc.epochs, self.checkpointer.dir.parent) if epoch_stats and end_epoch < tc.epochs else COMPLETED
        log.info(
            "%s: val top-1 %.2f (best %.2f), top-5 %.2f on %d images; %s",
            ending.state,
            metrics["top1"],
            self.best_top1,
            metrics["top5"],
            metrics["samples"],
            input_bound_verdict(wait, self.loader_name) if epoch_stats else "eval only",
        )
        return ending
