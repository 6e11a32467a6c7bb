"""Optimizer parameter groups, LR scaling and the per-step schedules (timm), on a tiny model."""

from __future__ import annotations

import re

import pytest
import torch

from dali_train.config import ModelConfig, TrainerConfig
from dali_train.distributed import DistInfo
from dali_train.errors import UserError
from dali_train.models import build_model
from dali_train.optim import build_optimizer, build_scheduler
from dali_train.options import SCHEDULER_SCHEMAS, SgdConfig, TimmOptimizerConfig
from dali_train.parts import build_train_parts


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


def test_muon_orthogonalizes_in_fp32_on_cpu_and_steps():
    """timm's Muon computes Newton-Schulz in bf16, ~100x slower than fp32 on CPUs without bf16 units
    (the 5-epoch recipe's one CPU step took 9 min): on CPU it runs in fp32."""
    import timm.optim.muon as muon

    model = tiny_model()
    model(torch.zeros(1, 3, 8, 8))
    opt = build_optimizer(opt_cfg(name="muon", lr=1.6e-2, scale_lr=False), model, global_batch=32)
    coefficients = muon.resolve_ns_coefficients("quintic", muon._COEFFICIENTS)
    assert muon.zeropower_via_newtonschulz(torch.randn(4, 8), 5, coefficients).dtype == torch.float32
    assert muon.zeropower_via_newtonschulz(torch.randn(4, 8, device="meta"), 5, coefficients).dtype == torch.bfloat16
    before = model[0].weight.detach().clone()
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    assert not torch.equal(model[0].weight, before) and torch.isfinite(model[0].weight).all()


def test_an_unset_betas_or_eps_is_the_optimizers_own():
    """Only what the config sets is passed: lion keeps its betas 0.9/0.99, adan its three."""
    model = tiny_model()
    model(torch.zeros(1, 3, 8, 8))
    lion = build_optimizer(opt_cfg(name="lion", lr=1e-4), model, global_batch=256).param_groups[0]
    assert lion["betas"] == (0.9, 0.99)
    adan = build_optimizer(opt_cfg(name="adan", lr=1e-3), model, global_batch=256).param_groups[0]
    assert len(adan["betas"]) == 3
    set_ = build_optimizer(opt_cfg(name="lion", lr=1e-4, betas=[0.95, 0.98]), model, global_batch=256)
    assert set_.param_groups[0]["betas"] == (0.95, 0.98)
    # ranger.yaml's betas with the name of an optimizer without betas: ignored, as before
    sgdp = build_optimizer(opt_cfg(name="lookahead_sgdp", lr=0.1, betas=[0.95, 0.99]), model, global_batch=256)
    assert "betas" not in sgdp.param_groups[0]


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(name="adamw", betas=[0.9]), "optimizer.betas=[0.9]: adamw takes 2 (or optimizer.betas=null for its own)"),
        (dict(name="adamw", betas=[0.9, 1.5]), "optimizer.betas=1.5: must be in [0, 1)"),
        (dict(name="sgd", momentum=-0.9), "optimizer.momentum=-0.9"),
        (dict(name="adamw", weight_decay=-1.0), "optimizer.weight_decay=-1.0"),
    ],
)
def test_out_of_range_optimizer_values_fail_with_the_config(kw, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        opt_cfg(**kw)


def test_weight_decay_exclusions_survive_the_compile_wrap():
    """timm matches no_weight_decay() names (a ViT's pos_embed, cls_token); compile's wrapper
    prefixes every name with _orig_mod. (DDP's with module.): the optimizer sees the bare model."""
    vit = build_model(ModelConfig(name="test_vit"), 10)
    parts = build_train_parts(
        ModelConfig(name="test_vit"), opt_cfg(name="adamw", lr=1e-3, weight_decay=0.05),
        sched_cfg(name="cosine"), TrainerConfig(compile=True, amp="off"), seed=0, dist=DistInfo(0, 0, 1),
        device=torch.device("cpu"), num_classes=10, updates_per_epoch=4, global_batch=256, amp_dtype=None,
    )  # fmt: skip
    assert hasattr(parts.model, "_orig_mod")
    names = {id(p): n for n, p in parts.model._orig_mod.named_parameters()}
    decayed = {names[id(p)] for g in parts.optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert "pos_embed" in vit.no_weight_decay() and not decayed & {"pos_embed", "cls_token"}, decayed


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


def test_a_min_lr_above_the_peak_fails_and_schedules_other_than_asked_are_said(caplog):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(UserError, match=r"scheduler.min_lr=0.5: above the peak LR 0.1"):
        build_scheduler(sched_cfg(name="cosine", min_lr=0.5), opt, steps_per_epoch=10, epochs=4)
    with caplog.at_level("WARNING", logger="dali_train"):
        build_scheduler(sched_cfg(name="cosine", warmup_epochs=1), opt, steps_per_epoch=10, epochs=1)
    assert "scheduler.warmup_epochs=1 spans the whole run (trainer.epochs=1)" in caplog.text
    # a schedule other than the one asked for, said: a warmup that goes down, a step schedule that never drops
    caplog.clear()
    with caplog.at_level("WARNING", logger="dali_train"):
        for kw in (dict(name="cosine", warmup_epochs=1, warmup_lr_init=0.2), dict(name="step", decay_epochs=30),
                   dict(name="step", decay_epochs=2)):  # fmt: skip
            fresh = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # a schedule sets the group's LR
            build_scheduler(sched_cfg(**kw), fresh, steps_per_epoch=10, epochs=4)
    assert "scheduler.warmup_lr_init=0.2 is above the peak LR 0.1" in caplog.text
    assert caplog.text.count("no drop within trainer.epochs=4") == 1 and "decay_epochs=30" in caplog.text
    for key, value in (("decay_epochs", 0.0), ("decay_rate", 1.5)):
        with pytest.raises(UserError, match=f"scheduler.{key}={value}"):
            sched_cfg(name="step", **{key: value})
