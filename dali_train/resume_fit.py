"""Whether a checkpoint fits the run that loads it, and its optimizer state loaded into this run's:
one line naming the option that differs, instead of a wall of missing keys, a KeyError in the
optimizer, or a silent wrong place in the epoch."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from timm.utils import unwrap_model

from dali_train.errors import UserError

log = logging.getLogger(__name__)

# Step counters some optimizers keep in their param groups (timm's Lookahead: when to sync the slow
# weights; timm's Lamb and Adan: bias correction): restored from the checkpoint, never reset.
GROUP_COUNTERS = ("lookahead_step", "step")


class CheckpointError(UserError):
    """A checkpoint that cannot be used for this run; one line."""


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint records about the run that wrote it, and what a resume is checked against."""

    model_name: str
    optimizer_name: str
    batch_size: int  # per process
    world_size: int
    grad_accum_steps: int
    updates_per_epoch: int  # optimizer steps per epoch: the schedule's unit
    train_files: int = 0  # files in the train split (each epoch's order permutes them); 0 = unknown
    classes: list[str] = field(default_factory=list)  # the train class folders, label order; [] = unknown
    config: dict[str, Any] = field(default_factory=dict)  # the plain run config, for the record


def network_change(saved_config: dict[str, Any] | None, model: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """(key, then, now) of the first model option that differs between a checkpoint's run config and
    this run's model section, among those no saved tensor shows; None when the networks are the same."""
    # the blurs' filters are buffers built, not loaded, and kwargs may change only activations
    # (act_layer: mish) with every shape the same
    # self_attention's tensors show, but by name the line says which option to set
    for key, default in (("stem_blur_pool", False), ("blur_strided_convs", False), ("self_attention", False), ("kwargs", {})):
        then = (saved_config or {}).get("model", {}).get(key, default)
        now = model.get(key, default)
        if then != now:
            return key, then, now
    return None


def check_evaluated_network(saved: dict[str, Any], model: Mapping[str, Any], path: str) -> None:
    """`trainer.eval_only` of `model.pretrained=` one of our checkpoints (`saved`): the network it was
    trained as, or one line, as a resume checks (fine-tuning from it may change the network on purpose)."""
    if saved["model_name"] != model["name"]:
        raise CheckpointError(
            f"model.name={model['name']}: trainer.eval_only=true evaluates model.pretrained={path}, a checkpoint "
            f"of {saved['model_name']} (evaluate it with model.name={saved['model_name']})"
        )
    if change := network_change(saved.get("config"), model):
        key, then, now = change
        raise CheckpointError(
            f"model.{key}={now}: trainer.eval_only=true evaluates model.pretrained={path}, trained with "
            f"model.{key}={then}; its weights would load into another network (evaluate with model.{key}={then})"
        )


def check_same_classes(saved: list[str], meta: CheckpointMeta, path: str, *, key: str = "trainer.resume") -> None:
    """Labels are indices into the sorted class folders: another dataset with as many classes (Imagewoof
    after Imagenette, renamed folders) loaded the head and trained or scored every class as another.
    `key`: the option that named the checkpoint (model.pretrained for an evaluation of its weights)."""
    if not saved or not meta.classes or list(saved) == list(meta.classes):
        return
    if len(saved) != len(meta.classes):
        which = f"{len(meta.classes)} classes here, {len(saved)} there"
    else:
        i = next(i for i, (a, b) in enumerate(zip(meta.classes, saved, strict=True)) if a != b)
        which = f"label {i} is {meta.classes[i]!r} here, {saved[i]!r} there"
    root = meta.config.get("data", {}).get("root")
    fix = "evaluate it on the data it was trained on"
    if key == "trainer.resume":
        fix = f"use the data it was trained on, or start from its weights with model.pretrained={path}"
    raise CheckpointError(
        f"data.root={root}: its classes are not the ones {key}={path} was trained on ({which}), so its "
        f"labels would name other classes; {fix}"
    )


def check_evaluated_classes(path: str, meta: CheckpointMeta) -> None:
    """`trainer.eval_only` of `model.pretrained=` one of our checkpoints: the classes it was trained on
    against the data's (check_same_classes). Other weight files record none and are not checked."""
    if path.endswith(".safetensors"):
        return
    state = torch.load(path, map_location="cpu", weights_only=True)  # readable: build_model has loaded it
    ours = isinstance(state, dict) and "model_name" in state and "format_version" in state  # as models.read_weights
    if ours and isinstance(state.get("classes"), list):
        check_same_classes(state["classes"], meta, path, key="model.pretrained")


def check_fits(
    state: dict[str, Any], meta: CheckpointMeta, model: torch.nn.Module, path: str, *, eval_only: bool = False
) -> None:
    """One line instead of a wall of missing keys, a KeyError in the optimizer, or a silent
    wrong position in the epoch. An evaluation (`eval_only`) needs only the network to match."""
    if state["model_name"] != meta.model_name:
        raise CheckpointError(
            f"trainer.resume={path}: checkpoint is of model {state['model_name']}, this run builds {meta.model_name}"
        )
    check_same_classes(state.get("classes") or [], meta, path)
    if change := network_change(state.get("config"), meta.config.get("model", {})):
        key, then, now = change
        raise CheckpointError(
            f"model.{key}={now}: trainer.resume={path} was trained with model.{key}={then}; "
            f"its weights would load into another network (resume with model.{key}={then}, or start "
            f"the new network from them with model.pretrained={path})"
        )
    own = unwrap_model(model).state_dict()
    theirs = state["model"]
    mismatched = [k for k in own if k not in theirs or theirs[k].shape != own[k].shape]
    if mismatched or len(theirs) != len(own):
        raise CheckpointError(
            f"trainer.resume={path}: weights do not fit {meta.model_name} "
            f"({len(mismatched)} tensors differ, e.g. {mismatched[:2]}); was it trained with another model.name or class count?"
        )
    if eval_only:
        return
    if state["optimizer_name"] != meta.optimizer_name:
        raise CheckpointError(
            f"optimizer.name={meta.optimizer_name}: trainer.resume={path} was trained with "
            f"optimizer.name={state['optimizer_name']}, whose state does not carry over; resume with "
            f"optimizer={state['optimizer_name']}, or start from its weights with model.pretrained={path}"
        )
    if state["next_step"] > 0 and state.get("train_files") and meta.train_files != state["train_files"]:
        # the documented way past a bad file is to exclude it and resume; not an error, but said
        log.warning(
            "the train split has %d files, trainer.resume=%s was saved in mid-epoch (epoch %d step %d) "
            "over %d: the rest of epoch %d follows a new order, so some of its images are read twice "
            "and others not at all (that epoch only)",
            meta.train_files,
            path,
            state["next_epoch"],
            state["next_step"],
            state["train_files"],
            state["next_epoch"],
        )
    if state["next_step"] > 0:
        ambiguous = "its place in the epoch is ambiguous"
        for key, then, now, why in (
            ("loader.batch_size", state["batch_size"], meta.batch_size, ambiguous),
            ("trainer.grad_accum_steps", state["grad_accum_steps"], meta.grad_accum_steps, ambiguous),
            ("world size (--nproc_per_node)", state["world_size"], meta.world_size, ambiguous),
            # the epoch's order is drawn from the seed
            ("seed", (state.get("config") or {}).get("seed", meta.config.get("seed")), meta.config.get("seed"),
             "the rest of the epoch would follow another order (some images read twice, others never)"),
        ):  # fmt: skip
            if then != now:
                raise CheckpointError(
                    f"{key}={now}: trainer.resume={path} was saved in mid-epoch (epoch {state['next_epoch']} "
                    f"step {state['next_step']}) with {key}={then}, so {why}; "
                    f"resume with {key}={then} (change it at an epoch boundary), or from an end-of-epoch checkpoint"
                )
        if state["next_step"] // meta.grad_accum_steps >= meta.updates_per_epoch:  # nothing left of it
            raise CheckpointError(
                f"trainer.resume={path} was saved in mid-epoch (epoch {state['next_epoch']} step "
                f"{state['next_step']}), past the end of this run's epochs of at most "
                f"{meta.updates_per_epoch * meta.grad_accum_steps} steps (a lower trainer.max_steps_per_epoch, "
                f"or fewer train files?); resume with the settings it was saved with, or from an end-of-epoch checkpoint"
            )


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], path: str) -> None:
    """The saved moments and step counts; hyperparameters (LR, decay, momentum) stay the current config's."""
    current = [
        {k: v for k, v in g.items() if k != "params" and k not in GROUP_COUNTERS} for g in optimizer.param_groups
    ]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as e:
        raise CheckpointError(
            f"trainer.resume={path}: its optimizer state does not fit this run's parameter groups "
            "(optimizer.no_wd_norm_bias changed, or optimizer.weight_decay to or from 0? or a model with "
            "no_weight_decay() names, a ViT say, "
            f"saved under torchrun or compile before dali-train kept its weight-decay groups there): {e}"
        ) from None
    for group, settings in zip(optimizer.param_groups, current, strict=True):
        group.update(settings)
