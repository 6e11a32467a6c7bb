"""Optimizers (timm's factory) and per-step LR schedules (timm's schedulers)."""

from __future__ import annotations

import logging

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler, PolyLRScheduler, StepLRScheduler
from timm.scheduler.scheduler import Scheduler

from dali_train.errors import UserError

log = logging.getLogger(__name__)

OPTIMIZER_NAMES = ("sgd", "adamw", "lamb")
SCHEDULER_NAMES = ("cosine", "step", "linear")


class OptimError(UserError):
    """An optimizer or scheduler option the user must fix; one line."""


def scaled_lr(base_lr: float, global_batch: int, scale: bool) -> float:
    """Linear scaling rule (Goyal et al. 2017): base_lr is the LR at a global batch of 256."""
    return base_lr * global_batch / 256 if scale else base_lr


def build_optimizer(cfg_opt, model: torch.nn.Module, *, global_batch: int) -> torch.optim.Optimizer:
    if cfg_opt.name not in OPTIMIZER_NAMES:
        raise OptimError(f"optimizer.name={cfg_opt.name}: unknown; choose one of {', '.join(OPTIMIZER_NAMES)}")
    lr = scaled_lr(cfg_opt.lr, global_batch, cfg_opt.scale_lr)
    if cfg_opt.name == "sgd":
        # timm's "sgd" is Nesterov SGD; "momentum" is plain heavy-ball momentum.
        kwargs = dict(opt="nesterov" if cfg_opt.nesterov else "momentum", momentum=cfg_opt.momentum)
    else:
        kwargs = dict(opt=cfg_opt.name, betas=tuple(cfg_opt.betas), eps=cfg_opt.eps)
    optimizer = create_optimizer_v2(
        model, lr=lr, weight_decay=cfg_opt.weight_decay, filter_bias_and_bn=cfg_opt.no_wd_norm_bias, **kwargs
    )
    decayed = sum(p.numel() for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"])
    total = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    log.info(
        "optimizer: %s, lr %.4g (base %.4g × global batch %d / 256%s), weight decay %.3g on %d of %d parameters",
        kwargs["opt"],
        lr,
        cfg_opt.lr,
        global_batch,
        "" if cfg_opt.scale_lr else ", not scaled",
        cfg_opt.weight_decay,
        decayed,
        total,
    )
    return optimizer


def build_scheduler(cfg_sched, optimizer: torch.optim.Optimizer, *, steps_per_epoch: int, epochs: int) -> Scheduler:
    """A schedule over optimizer steps (not epochs): call `step_update(global_step)` every step."""
    if cfg_sched.name not in SCHEDULER_NAMES:
        raise OptimError(f"scheduler.name={cfg_sched.name}: unknown; choose one of {', '.join(SCHEDULER_NAMES)}")
    warmup = round(cfg_sched.warmup_epochs * steps_per_epoch)
    total = max(epochs * steps_per_epoch, 1)
    common = dict(warmup_t=warmup, warmup_lr_init=cfg_sched.warmup_lr_init, warmup_prefix=True, t_in_epochs=False)
    if cfg_sched.name == "cosine":
        return CosineLRScheduler(optimizer, t_initial=max(total - warmup, 1), lr_min=cfg_sched.min_lr, **common)
    if cfg_sched.name == "linear":  # FFCV's "cyclic": linear up to the peak, linear down to min_lr
        return PolyLRScheduler(
            optimizer, t_initial=max(total - warmup, 1), power=1.0, lr_min=cfg_sched.min_lr, **common
        )
    return StepLRScheduler(
        optimizer,
        decay_t=max(round(cfg_sched.decay_epochs * steps_per_epoch), 1),
        decay_rate=cfg_sched.decay_rate,
        **common,
    )
