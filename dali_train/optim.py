"""Optimizers (timm's factory) and per-step LR schedules (timm's schedulers), built from the typed
option objects of `dali_train.options` (checked there); each builder is chosen by name from a dict."""

from __future__ import annotations

import functools
import inspect
import logging
import math

import torch
from timm.optim import create_optimizer_v2, get_optimizer_info
from timm.scheduler import CosineLRScheduler, PolyLRScheduler, StepLRScheduler
from timm.scheduler.scheduler import Scheduler

from dali_train.errors import UserError
from dali_train.options import (
    LOOKAHEAD,
    AnnealSchedulerConfig,
    FlatCosSchedulerConfig,
    OptimizerConfig,
    SchedulerConfig,
    StepSchedulerConfig,
)

log = logging.getLogger(__name__)



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


def _optimizer_kwargs(opt: OptimizerConfig) -> dict:
    """timm's name and the hyperparameters the chosen optimizer takes (its registry says which)."""
    if opt.name == "sgd":  # an SgdConfig
        # timm's "sgd" is Nesterov SGD; "momentum" is plain heavy-ball momentum.
        return dict(opt="nesterov" if opt.nesterov else "momentum", momentum=opt.momentum)
    info = get_optimizer_info(opt.name.removeprefix(LOOKAHEAD))
    kwargs = dict(opt=opt.name)
    if info.has_betas and opt.betas is not None:  # else the optimizer's own (lion 0.9/0.99, adan three...)
        kwargs["betas"] = tuple(opt.betas)
    if info.has_eps and opt.eps is not None:
        kwargs["eps"] = opt.eps
    return {**kwargs, **opt.kwargs}


def newton_schulz_in_fp32_on_cpu() -> None:
    """timm's Muon orthogonalizes in bf16, which a CPU without bf16 matrix units runs ~100x slower than
    fp32 (one step of the Imagenette recipes' network: 9 min on 2 cores): CPU tensors get fp32, CUDA
    keeps bf16. A wrapper of timm's function, since its Muon exposes no dtype."""
    import timm.optim.muon as muon

    original = muon.zeropower_via_newtonschulz
    if getattr(original, "fp32_on_cpu", False):
        return

    signature = inspect.signature(original)

    @functools.wraps(original)
    def newton_schulz(G: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        call = signature.bind(G, *args, **kwargs)
        call.apply_defaults()
        if G.device.type == "cpu" and call.arguments["dtype"] == torch.bfloat16:
            call.arguments["dtype"] = torch.float32
        return original(*call.args, **call.kwargs)

    newton_schulz.fp32_on_cpu = True
    muon.zeropower_via_newtonschulz = newton_schulz


def build_optimizer(opt: OptimizerConfig, model: torch.nn.Module, *, global_batch: int) -> torch.optim.Optimizer:
    """timm's `create_optimizer_v2` for `opt` (an SgdConfig or a TimmOptimizerConfig, checked)."""
    lr = scaled_lr(opt.lr, global_batch, opt.scale_lr)
    kwargs = _optimizer_kwargs(opt)
    if "muon" in opt.name and any(p.device.type == "cpu" for p in model.parameters()):
        newton_schulz_in_fp32_on_cpu()
    try:
        optimizer = create_optimizer_v2(
            model, lr=lr, weight_decay=opt.weight_decay, filter_bias_and_bn=opt.no_wd_norm_bias, **kwargs
        )
    except (TypeError, ValueError) as e:  # an optimizer.kwargs entry the optimizer class does not take (or its value)
        raise OptimError(f"optimizer.kwargs={opt.kwargs}: {opt.name} rejected them ({e})") from None
    decayed = sum(p.numel() for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"])
    total = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    log.info(
        "optimizer: %s, lr %.4g (base %.4g × global batch %d / 256%s), weight decay %.3g on %d of %d parameters",
        kwargs["opt"],
        lr,
        opt.lr,
        global_batch,
        "" if opt.scale_lr else ", not scaled",
        opt.weight_decay,
        decayed,
        total,
    )
    return optimizer


def _warmup(sched: SchedulerConfig, warmup: int) -> dict:
    return dict(warmup_t=warmup, warmup_lr_init=sched.warmup_lr_init, warmup_prefix=True, t_in_epochs=False)


def _cosine(sched: AnnealSchedulerConfig, optimizer, *, warmup: int, total: int, steps_per_epoch: int) -> Scheduler:
    return CosineLRScheduler(optimizer, t_initial=max(total - warmup, 1), lr_min=sched.min_lr, **_warmup(sched, warmup))


def _flat_cos(sched: FlatCosSchedulerConfig, optimizer, *, warmup: int, total: int, steps_per_epoch: int) -> Scheduler:
    """fastai's fit_flat_cos: the peak LR, then a cosine anneal over the last steps."""
    flat = warmup + round(sched.flat_frac * max(total - warmup, 1))
    return FlatCosineLRScheduler(
        optimizer, warmup_t=warmup, warmup_lr_init=sched.warmup_lr_init, flat_t=flat, total_t=total, lr_min=sched.min_lr
    )


def _linear(sched: AnnealSchedulerConfig, optimizer, *, warmup: int, total: int, steps_per_epoch: int) -> Scheduler:
    """FFCV's "cyclic": linear up to the peak, linear down to min_lr."""
    t_initial = max(total - warmup, 1)
    return PolyLRScheduler(optimizer, t_initial=t_initial, power=1.0, lr_min=sched.min_lr, **_warmup(sched, warmup))


def _step(sched: StepSchedulerConfig, optimizer, *, warmup: int, total: int, steps_per_epoch: int) -> Scheduler:
    """Drops at fixed epochs counted from the run's start, warmup included (Goyal et al.: 30, 60, 80
    with a 5-epoch warmup), not shifted by the warmup as a prefix would."""
    decay_t = max(round(sched.decay_epochs * steps_per_epoch), 1)
    kwargs = {**_warmup(sched, warmup), "warmup_prefix": False}
    return StepLRScheduler(optimizer, decay_t=decay_t, decay_rate=sched.decay_rate, **kwargs)


SCHEDULERS = {"cosine": _cosine, "flat_cos": _flat_cos, "linear": _linear, "step": _step}  # scheduler.name -> builder


def build_scheduler(
    sched: SchedulerConfig, optimizer: torch.optim.Optimizer, *, steps_per_epoch: int, epochs: int
) -> Scheduler:
    """A schedule over optimizer steps (not epochs): call `step_update(global_step)` every step."""
    if sched.name not in SCHEDULERS:
        raise OptimError(f"scheduler.name={sched.name}: unknown; choose one of {', '.join(SCHEDULERS)}")
    warmup = round(sched.warmup_epochs * steps_per_epoch)
    total = max(epochs * steps_per_epoch, 1)
    peak = max(g["lr"] for g in optimizer.param_groups)
    min_lr = getattr(sched, "min_lr", 0.0)
    if min_lr > peak:
        raise OptimError(f"scheduler.min_lr={min_lr}: above the peak LR {peak:.4g} (optimizer.lr, scaled); the LR would rise")
    if warmup >= total and warmup > 0:  # a smoke test's trainer.epochs=1 with cosine's 1-epoch warmup, say
        log.warning(
            "scheduler.warmup_epochs=%s spans the whole run (trainer.epochs=%d): the LR only warms up, never anneals",
            sched.warmup_epochs,
            epochs,
        )
    if warmup > 0 and sched.warmup_lr_init > peak:  # fine-tuning at a small LR and batch under the 1e-5 default
        log.warning(
            "scheduler.warmup_lr_init=%g is above the peak LR %.4g (optimizer.lr, scaled): the warmup lowers the LR",
            sched.warmup_lr_init,
            peak,
        )
    decay_epochs = getattr(sched, "decay_epochs", None)  # scheduler=step: its default (30) outlasts a short run
    if decay_epochs is not None and round(decay_epochs * steps_per_epoch) >= total:
        log.warning(
            "scheduler.decay_epochs=%s: no drop within trainer.epochs=%d, the LR stays at its peak", decay_epochs, epochs
        )
    return SCHEDULERS[sched.name](sched, optimizer, warmup=warmup, total=total, steps_per_epoch=steps_per_epoch)
