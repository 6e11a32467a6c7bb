"""The image sides a run feeds its model, checked at startup against a model that takes one side
only: timm's ViT, DeiT, Swin, Mixer and kin assert it at their first forward, which for
validation's side came after the first epoch's training (a crash that lost it), and for progressive
resizing's sides epochs later."""

from __future__ import annotations

import inspect

import torch
from timm.utils import unwrap_model

from dali_train.config import DataConfig
from dali_train.data import progressive_size
from dali_train.models import ModelError


def fixed_input_side(model: torch.nn.Module) -> tuple[int, int] | None:
    """The (H, W) the model accepts only, or None: its input patch embedding (`patch_embed`, or a
    Mixer's `stem`, where timm's own fixed-size test looks) with `strict_img_size` set. Only that
    one: a later stage's (visformer's, behind a strided stem) names another side."""
    bare = unwrap_model(model)  # DDP's and compile's wrappers off
    embed = getattr(bare, "patch_embed", None) or getattr(bare, "stem", None)
    if getattr(embed, "strict_img_size", False) and getattr(embed, "img_size", None):
        return tuple(embed.img_size)
    return None


def run_input_sides(data: DataConfig, *, epochs: int, eval_only: bool, progressive: bool = True) -> dict[str, int]:
    """Config key (with the epoch, under progressive resizing) -> the square side it feeds the model.
    `progressive`: whether the loader follows data.progressive (loader=synthetic does not)."""
    sides = {"data.val_size": data.val_size}
    if eval_only:
        return sides
    if not (progressive and data.progressive.enabled):
        return sides | {"data.train_size": data.train_size}
    size_at = progressive_size(data)
    for epoch in range(epochs):
        if epoch == 0 or size_at(epoch) not in sides.values():
            sides[f"data.progressive (epoch {epoch})"] = size_at(epoch)
    return sides


def check_input_sides(model: torch.nn.Module, model_name: str, sides: dict[str, int]) -> None:
    """A ModelError naming the keys whose side a fixed-size model would reject."""
    fixed = fixed_input_side(model)
    wrong = {key: side for key, side in sides.items() if fixed is not None and (side, side) != fixed}
    if wrong:
        what = ", ".join(f"{key}={side}" for key, side in wrong.items())
        takes = inspect.signature(type(unwrap_model(model))).parameters
        build = "model.kwargs.img_size=N" + (" or model.kwargs.dynamic_img_size=true" if "dynamic_img_size" in takes else "")
        raise ModelError(
            f"model.name={model_name} takes {fixed[0]}x{fixed[1]} px images only, not {what}: set them to "
            f"{fixed[0]}, or build the model for them ({build})"
        )
