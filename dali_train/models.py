"""Models: a thin `build_model` over `timm.create_model`; weights only from local files."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import timm
import torch

from dali_train.errors import UserError

log = logging.getLogger(__name__)


class ModelError(UserError):
    """A model option the user must fix; one line."""


def build_model(
    name: str,
    num_classes: int,
    *,
    drop_path_rate: float = 0.0,
    pretrained: str | None = None,
    kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """`timm.create_model(name, **kwargs)`: kwargs reach the model class (timm's ResNet takes
    act_layer, aa_layer, block_args={attn_layer: se}, cardinality, base_width, stem_type, ...)."""
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('.')[0][:6]}*")[:5]
        raise ModelError(f"model.name={name}: not a timm model (similar: {', '.join(close) or 'none'})")
    kwargs = dict(kwargs or {})
    if drop_path_rate:
        kwargs["drop_path_rate"] = drop_path_rate
    try:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    except (TypeError, ValueError, KeyError, AssertionError) as e:  # a kwarg the model class does not take
        raise ModelError(f"model.kwargs={kwargs}: {name} rejected them ({type(e).__name__}: {e})") from None
    if pretrained:
        load_pretrained(model, pretrained)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s, %.1fM parameters, %d classes", name, n_params / 1e6, num_classes)
    return model


def load_pretrained(model: torch.nn.Module, path: str) -> None:
    """Weights from a local file (a raw state_dict or one of our checkpoints); a classifier of
    another size is left at its fresh initialization (fine-tuning on other classes)."""
    if not Path(path).is_file():
        raise ModelError(f"model.pretrained={path}: no such file (weights are never downloaded)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    state = state.get("model", state.get("state_dict", state)) if isinstance(state, dict) else state
    own = model.state_dict()
    kept = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not kept:
        raise ModelError(f"model.pretrained={path}: no tensor matches this model's parameters")
    model.load_state_dict(kept, strict=False)
    log.info("model: %d/%d tensors loaded from %s", len(kept), len(own), path)
