"""Optimizer parameter groups, LR scaling and the per-step schedules (timm), on a tiny model."""

from __future__ import annotations

import pytest
import torch

from dali_train.errors import UserError
from dali_train.optim import build_optimizer, build_scheduler
from dali_train.options import SCHEDULER_SCHEMAS, SgdConfig, TimmOptimizerConfig


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )


def opt_cfg(**kw):
    """The typed option object, as train.py hands it to the builder (values checked on creation)."""
    return SgdConfig(**kw) if kw.get("name", "sgd") == "sgd" else TimmOptimizerConfig(**kw)


def sched_cfg(**kw):
    """The schema of `name`, with the keys of `kw` it has (each schedule has its own keys)."""
    schema = SCHEDULER_SCHEMAS[kw["name"]]
    return schema(**{k: v for k, v in kw.items() if k in schema.__dataclass_fields__})


def test_no_weight_decay_on_norm_and_bias_and_linear_lr_scaling():
    model = tiny_model()
    model(torch.zeros(1, 3, 8, 8))
    opt = build_optimizer(opt_cfg(lr=0.1, weight_decay=1e-4), model, global_batch=1024)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model[0].weight), id(model[3].weight)}  # conv and linear weights only
    assert all(g["lr"] == pytest.approx(0.4) for g in opt.param_groups)  # 0.1 x 1024 / 256
    unscaled = build_optimizer(opt_cfg(lr=0.1, scale_lr=False), model, global_batch=1024)
    assert unscaled.param_groups[0]["lr"] == pytest.approx(0.1)


def test_sgd_nesterov_switch_and_other_optimizers():
    model = tiny_model()
    model(torch.zeros(1, 3, 8, 8))
    assert build_optimizer(opt_cfg(nesterov=True), model, global_batch=256).param_groups[0]["nesterov"]
    assert not build_optimizer(opt_cfg(nesterov=False), model, global_batch=256).param_groups[0]["nesterov"]
    for name in ("adamw", "lamb"):
        assert build_optimizer(opt_cfg(name=name, lr=1e-3), model, global_batch=256).param_groups[0]["lr"] > 0
    with pytest.raises(UserError, match="optimizer.name=adamm: not a timm optimizer"):
        build_optimizer(opt_cfg(name="adamm"), model, global_batch=256)


def test_any_timm_optimizer_by_name_gets_the_hyperparameters_it_takes():
    model = tiny_model()
    model(torch.zeros(1, 3, 8, 8))
    ranger = build_optimizer(
        opt_cfg(name="lookahead_radamw", lr=4e-3, scale_lr=False, betas=[0.95, 0.99], eps=1e-6), model, global_batch=32
    )
    assert type(ranger).__name__ == "Lookahead"
    inner = ranger.param_groups[0]  # shared with the wrapped RAdamW
    assert inner["betas"] == (0.95, 0.99) and inner["eps"] == 1e-6 and inner["lr"] == pytest.approx(4e-3)
    rmsprop = build_optimizer(opt_cfg(name="rmsprop", kwargs={"momentum": 0.5}), model, global_batch=256)
    assert rmsprop.param_groups[0]["momentum"] == 0.5 and "betas" not in rmsprop.param_groups[0]
    with pytest.raises(UserError, match="lookahead_"):
        build_optimizer(opt_cfg(name="lookahead_nosuch"), model, global_batch=256)


@pytest.mark.parametrize("name", ["cosine", "flat_cos", "linear", "step"])
def test_schedule_at_start_end_of_warmup_and_last_step(name):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = build_scheduler(
        sched_cfg(name=name, warmup_epochs=1, warmup_lr_init=0.01, min_lr=0.0, decay_epochs=2, decay_rate=0.1),
        opt,
        steps_per_epoch=10,
        epochs=4,
    )

    def lr_at(step: int) -> float:
        sched.step_update(num_updates=step)
        return opt.param_groups[0]["lr"]

    assert lr_at(0) == pytest.approx(0.01)
    assert lr_at(5) == pytest.approx(0.01 + (1.0 - 0.01) * 0.5)  # linear warmup
    assert lr_at(10) == pytest.approx(1.0)  # peak right after warmup
    last = lr_at(40)
    # step: drops at updates 20 and 40 (epochs 2 and 4, counted from the start, warmup included)
    assert last == pytest.approx({"cosine": 0.0, "flat_cos": 0.0, "linear": 0.0, "step": 0.01}[name], abs=1e-6)


def test_step_drops_at_fixed_epochs_with_a_warmup():
    """scheduler=step with 5 warmup epochs drops at epochs 30 and 60 (Goyal et al.), not 35 and 65."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(
        sched_cfg(name="step", warmup_epochs=5, decay_epochs=30, decay_rate=0.1), opt, steps_per_epoch=10, epochs=90
    )

    def lr_at(update: int) -> float:
        sched.step_update(num_updates=update)
        return opt.param_groups[0]["lr"]

    assert lr_at(10) < lr_at(50) == lr_at(299) == 1.0  # warming up, then the peak
    assert lr_at(300) == pytest.approx(0.1) and lr_at(599) == pytest.approx(0.1)
    assert lr_at(600) == pytest.approx(0.01)


def test_flat_cos_holds_the_peak_then_anneals_over_the_last_steps():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(sched_cfg(name="flat_cos", flat_frac=0.75, min_lr=0.1), opt, steps_per_epoch=10, epochs=4)
    lrs = []
    for step in range(41):
        sched.step_update(num_updates=step)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[:31] == [1.0] * 31  # flat for 75% of 40 steps
    assert all(a > b for a, b in zip(lrs[30:], lrs[31:], strict=False))  # then strictly decreasing
    assert lrs[35] == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the cosine
    assert lrs[40] == pytest.approx(0.1)
    with pytest.raises(UserError, match="scheduler.flat_frac=1.0"):
        build_scheduler(sched_cfg(name="flat_cos", flat_frac=1.0), opt, steps_per_epoch=10, epochs=4)
