"""Optimizers (timm's factory) and per-step LR schedules (timm's schedulers)."""

from __future__ import annotations

import logging
import math

import torch
from timm.optim import create_optimizer_v2, get_optimizer_info, list_optimizers
from timm.scheduler import CosineLRScheduler, PolyLRScheduler, StepLRScheduler
from timm.scheduler.scheduler import Scheduler

from dali_train.errors import UserError

log = logging.getLogger(__name__)

SCHEDULER_NAMES = ("cosine", "flat_cos", "step", "linear")
LOOKAHEAD = "lookahead_"  # timm's prefix: any optimizer wrapped in Lookahead (lookahead_radamw is Ranger)


class OptimError(UserError):
    """An optimizer or scheduler option the user must fix; one line."""


class FlatCosineLRScheduler(Scheduler):
    """Linear warmup to the peak, the peak held until step `flat_t`, then a cosine anneal to `lr_min`
    at `total_t`, per update. Ours because timm's equivalent (WSDLRScheduler with decay_fn=cosine)
    only exists in timm releases newer than the ones we support."""

    def __init__(
        self, optimizer, *, warmup_t: int, warmup_lr_init: float, flat_t: int, total_t: int, lr_min: float
    ) -> None:
        super().__init__(optimizer, param_group_field="lr", t_in_epochs=False)
        self.warmup_t, self.warmup_lr_init, self.lr_min = warmup_t, warmup_lr_init, lr_min
        self.flat_t, self.total_t = flat_t, max(total_t, flat_t + 1)
        self.update_groups(self._get_lr(0))

    def _get_lr(self, t: int) -> list[float]:
        if t < self.warmup_t:
            return [self.warmup_lr_init + (v - self.warmup_lr_init) * t / self.warmup_t for v in self.base_values]
        frac = min(max(t - self.flat_t, 0) / (self.total_t - self.flat_t), 1.0)
        factor = 0.5 * (1 + math.cos(math.pi * frac))
        return [self.lr_min + (v - self.lr_min) * factor for v in self.base_values]


def scaled_lr(base_lr: float, global_batch: int, scale: bool) -> float:
    """Linear scaling rule (Goyal et al. 2017): base_lr is the LR at a global batch of 256."""
    return base_lr * global_batch / 256 if scale else base_lr


def check_optimizer_name(name: str) -> None:
    """`sgd`, or a name timm's optimizer registry knows, optionally with the `lookahead_` prefix."""
    base = name.removeprefix(LOOKAHEAD)
    if name != "sgd" and base not in list_optimizers():
        close = [n for n in list_optimizers() if base[:4] and base[:4] in n][:6]
        raise OptimError(
            f"optimizer.name={name}: not a timm optimizer (similar: {', '.join(close) or 'none'}; "
            "all: timm.optim.list_optimizers(), any of them with the lookahead_ prefix)"
        )


def _optimizer_kwargs(cfg_opt) -> dict:
    """timm's name and the hyperparameters the chosen optimizer takes (its registry says which)."""
    if cfg_opt.name == "sgd":
        # timm's "sgd" is Nesterov SGD; "momentum" is plain heavy-ball momentum.
        return dict(opt="nesterov" if cfg_opt.nesterov else "momentum", momentum=cfg_opt.momentum)
    info = get_optimizer_info(cfg_opt.name.removeprefix(LOOKAHEAD))
    kwargs = dict(opt=cfg_opt.name)
    if info.has_betas:
        kwargs["betas"] = tuple(cfg_opt.betas)
    if info.has_eps:
        kwargs["eps"] = cfg_opt.eps
    if info.has_momentum:
        kwargs["momentum"] = cfg_opt.momentum
    return kwargs


def build_optimizer(cfg_opt, model: torch.nn.Module, *, global_batch: int) -> torch.optim.Optimizer:
    check_optimizer_name(cfg_opt.name)
    lr = scaled_lr(cfg_opt.lr, global_batch, cfg_opt.scale_lr)
    kwargs = _optimizer_kwargs(cfg_opt)
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
    if cfg_sched.name == "flat_cos":  # fastai's fit_flat_cos: peak LR, then a cosine anneal over the last steps
        if not 0 <= cfg_sched.flat_frac < 1:
            raise OptimError(f"scheduler.flat_frac={cfg_sched.flat_frac}: must be in [0, 1)")
        flat = warmup + round(cfg_sched.flat_frac * max(total - warmup, 1))
        return FlatCosineLRScheduler(
            optimizer,
            warmup_t=warmup,
            warmup_lr_init=cfg_sched.warmup_lr_init,
            flat_t=flat,
            total_t=total,
            lr_min=cfg_sched.min_lr,
        )
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
