"""The training loop (evaluation: dali_train/evaluate.py). It is handed built objects and never sees the config.

Host syncs (`.item()`, collectives) happen only at log intervals and at the end of an epoch: the
GPU runs ahead of Python in between. Data-wait is the host time blocked in `next(loader)`; with the
CUDA queue bounded by those syncs it is the time the GPU would have starved.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from dali_train.distributed import DistInfo, StopFlag, all_reduce_max, all_reduce_sum
from dali_train.divergence import Diverged, LossWatch
from dali_train.logs import MetricsWriter, Progress

log = logging.getLogger(__name__)


@dataclass
class TrainParts:
    """What one optimization step needs, built by train.py (by keyword)."""

    model: torch.nn.Module  # possibly compiled and DDP-wrapped
    optimizer: torch.optim.Optimizer
    scheduler: Any  # timm scheduler, stepped per optimizer step
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    device: torch.device
    dist: DistInfo
    amp_dtype: torch.dtype | None = None  # autocast dtype; None = fp32
    scaler: torch.amp.GradScaler | None = None  # fp16 only
    ema: torch.nn.Module | None = None  # timm ModelEmaV3
    mixup: Callable | None = None  # timm Mixup: (images, labels) -> (images, soft targets)
    grad_accum_steps: int = 1
    clip_grad_norm: float | None = None
    global_step: int = 0  # optimizer steps so far, all epochs


@dataclass
class LoopControl:
    """How the epoch loop logs, saves and stops, built by fit.Fit (by keyword)."""

    writer: MetricsWriter
    log_every: int = 50
    max_steps: int | None = None
    save_every: int = 0
    save: Callable[[int, int], None] = lambda epoch, next_step: None  # mid-epoch checkpoint
    stop: StopFlag = field(default_factory=StopFlag)
    max_nonfinite_skips: int = 0  # 0: a NaN/inf loss stops the run (Diverged); N: skip up to N updates
    skipped_updates: int = 0  # updates skipped for a NaN/inf loss so far in this job


@dataclass
class EpochStats:
    loss: float
    img_per_s: float
    data_wait_frac: float
    steps: int
    interrupted: bool
    lr: float  # the LR of the epoch's last update


def updates_per_epoch(loader_steps: int, max_steps: int | None, grad_accum_steps: int) -> int:
    """Optimizer steps per epoch as the loop makes them: one every `grad_accum_steps` micro-steps
    and one on the epoch's last (partial) group, so ceil, not floor."""
    steps = loader_steps if max_steps is None else min(loader_steps, max_steps)
    return max(math.ceil(steps / grad_accum_steps), 1)


def autocast_for(parts: TrainParts):
    if parts.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(parts.device.type, dtype=parts.amp_dtype)


def _optimizer_step(p: TrainParts) -> None:
    if p.scaler is not None:
        if p.clip_grad_norm:
            p.scaler.unscale_(p.optimizer)
            torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.clip_grad_norm)
        p.scaler.step(p.optimizer)
        p.scaler.update()
    else:
        if p.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.clip_grad_norm)
        p.optimizer.step()
    p.optimizer.zero_grad(set_to_none=True)
    p.global_step += 1
    p.scheduler.step_update(num_updates=p.global_step)
    if p.ema is not None:
        p.ema.update(p.model, step=p.global_step)


class BufferSnapshot:
    """The model's buffers (BatchNorm running stats and batch counts) at the start of an accumulation
    window, put back when its update is skipped: the forward passes that met the NaN/inf have
    already folded it into them. Kept only with trainer.max_nonfinite_skips (a copy per update)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.live = list(model.buffers())
        self.saved = [b.detach().clone() for b in self.live]

    @torch.no_grad()
    def take(self) -> None:
        for saved, live in zip(self.saved, self.live, strict=True):
            saved.copy_(live)

    @torch.no_grad()
    def restore(self) -> None:
        for saved, live in zip(self.saved, self.live, strict=True):
            live.copy_(saved)


def _skip_update(p: TrainParts) -> None:
    """An update whose loss was NaN/inf: the gradients are dropped, the schedule moves on (as
    when the fp16 GradScaler skips one), so step counts and resume positions stay aligned."""
    p.optimizer.zero_grad(set_to_none=True)
    p.global_step += 1
    p.scheduler.step_update(num_updates=p.global_step)


def train_step(p: TrainParts, images: torch.Tensor, labels: torch.Tensor, *, update: bool) -> torch.Tensor:
    """Forward and backward of one micro-batch, then the optimizer step when `update`.

    Returns the (unscaled) loss tensor; nothing here waits for the GPU.
    """
    loss = forward_backward(p, images, labels, update=update)
    if update:
        _optimizer_step(p)
    return loss


def forward_backward(
    p: TrainParts, images: torch.Tensor, labels: torch.Tensor, *, update: bool, window: int | None = None
) -> torch.Tensor:
    """Forward and backward of one micro-batch (gradients all-reduced when `update`); no sync.
    `window`: micro-batches in this accumulation window (default grad_accum_steps; fewer in an
    epoch's last, partial one), so that each update is the mean gradient of its own micro-batches."""
    targets = labels
    if p.mixup is not None:
        images, targets = p.mixup(images, labels)
    is_ddp = isinstance(p.model, torch.nn.parallel.DistributedDataParallel)
    # No all-reduce on accumulating micro-steps: gradients sum locally until the update.
    sync = contextlib.nullcontext() if (update or not is_ddp) else p.model.no_sync()
    with sync:
        with autocast_for(p):
            loss = p.loss_fn(p.model(images), targets)
        window = p.grad_accum_steps if window is None else window
        scaled = loss / window if window > 1 else loss  # no divide-by-1 kernel pair
        (p.scaler.scale(scaled) if p.scaler is not None else scaled).backward()
    return loss


def train_one_epoch(
    p: TrainParts, loader: Iterable, ctl: LoopControl, *, epoch: int, start_step: int = 0
) -> EpochStats:
    """One epoch from `start_step`. Raises Diverged on a NaN/inf loss (found at the next log
    interval or save, whichever comes first; with `max_nonfinite_skips`, at each update)."""
    p.model.train()
    # len(loader) is what is left of the epoch after `start_step`; max_steps caps the whole epoch
    total = len(loader) if ctl.max_steps is None else max(min(len(loader), ctl.max_steps - start_step), 1)
    progress = Progress(total, f"epoch {epoch}", p.dist.is_main)
    losses = LossWatch(p.device)
    skipping = ctl.max_nonfinite_skips > 0
    buffers = BufferSnapshot(p.model) if skipping else None

    def check_losses() -> None:  # host sync; a collective under DDP
        diverged = losses.check(p.dist, epoch=epoch)
        if diverged is not None:
            progress.close()
            raise diverged

    data_time = window_data = 0.0
    samples = window_samples = 0
    start = window_start = time.perf_counter()
    tick = fetch_start = start
    step = 0
    lr = p.optimizer.param_groups[0]["lr"]
    interrupted = False
    for step, (images, labels) in enumerate(loader, start=1):
        now = time.perf_counter()  # the wait for this batch: from the end of the previous step's work
        data_time, window_data = data_time + now - fetch_start, window_data + now - fetch_start
        update = step % p.grad_accum_steps == 0 or step == total
        window = min(p.grad_accum_steps, total - (step - 1) // p.grad_accum_steps * p.grad_accum_steps)
        if buffers is not None and (step - 1) % p.grad_accum_steps == 0:
            buffers.take()  # the window's first micro-step
        lr = p.optimizer.param_groups[0]["lr"]  # this update's (the scheduler sets the next one's after it)
        loss = forward_backward(p, images, labels, update=update, window=window)
        losses.add(loss, step=start_step + step, update=p.global_step + 1, lr=lr)
        if update and skipping:  # a host sync per update, the price of skipping instead of stopping
            diverged = losses.check(p.dist, epoch=epoch)
            if diverged is not None:
                ctl.skipped_updates += 1
                if ctl.skipped_updates > ctl.max_nonfinite_skips:
                    progress.close()
                    raise Diverged(
                        f"{diverged} (after {ctl.max_nonfinite_skips} skipped updates = trainer.max_nonfinite_skips)",
                        diverged.update,
                    )
                log.warning(
                    "skipped update %d of %d allowed: %s", ctl.skipped_updates, ctl.max_nonfinite_skips, diverged
                )
                buffers.restore()
                _skip_update(p)
            else:
                _optimizer_step(p)
        elif update:
            _optimizer_step(p)
        samples, window_samples = samples + labels.shape[0], window_samples + labels.shape[0]
        tick = time.perf_counter()
        last = step == total
        batch = start_step + step  # the epoch's: log rows fall on the batches an uninterrupted run logs
        if batch % ctl.log_every == 0 or last:
            # Host sync point: the loss value, the agreed stop flag, and the window timings.
            if not skipping:
                check_losses()
            elapsed = tick - window_start
            values = {
                "train/loss": loss.item(),
                "train/lr": lr,
                "perf/img_per_s": window_samples * p.dist.world_size / max(elapsed, 1e-9),
                # the slowest rank's wait: the one that holds the others back at the all-reduce
                "perf/data_wait_frac": all_reduce_max(window_data / max(elapsed, 1e-9), p.dist),
            }
            if p.device.type == "cuda":
                values["perf/gpu_mem_gib"] = torch.cuda.max_memory_allocated(p.device) / 2**30
            ctl.writer.step(values, p.global_step, epoch, batch=batch)
            progress.update(
                step,
                loss=values["train/loss"],
                lr=values["train/lr"],
                img_s=values["perf/img_per_s"],
                wait=values["perf/data_wait_frac"],
            )
            window_start, window_data, window_samples = tick, 0.0, 0
        # Ranks agree on a stop at the update whose window holds a log step (with accumulation, an
        # update's last micro-step is rarely a multiple of log_every itself).
        at_log_step = (batch - window) // ctl.log_every != batch // ctl.log_every
        if update and not last and ctl.stop.requested(p.dist, p.device, sync_point=at_log_step):
            interrupted = True
        if interrupted or last:
            break
        if ctl.save_every and update and p.global_step % ctl.save_every == 0:
            if not skipping:
                check_losses()  # never write a checkpoint past a NaN/inf loss
            ctl.save(epoch, start_step + step)
        fetch_start = time.perf_counter()  # logging and saving are not time spent waiting for data
    if losses.pending and not skipping:  # interrupted between log intervals
        check_losses()
    progress.close()
    elapsed = time.perf_counter() - start
    stats = losses.totals().cpu()
    all_reduce_sum(stats, p.dist)
    return EpochStats(
        loss=stats[0].item() / max(stats[1].item(), 1),  # the mean of the finite losses
        img_per_s=samples * p.dist.world_size / max(elapsed, 1e-9),
        data_wait_frac=all_reduce_max(data_time / max(elapsed, 1e-9), p.dist),
        steps=step,
        interrupted=interrupted,
        lr=lr,
    )
