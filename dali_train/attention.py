"""fastai's "simple self-attention" for timm ResNets: timm has no such layer, and the Imagenette
leaderboard's xse_resnext50 entries use it (xresnet `sa=True`: one layer, in the last block of the
first stage, after the block's SE). Written here because neither timm nor torch provides it."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from dali_train.errors import UserError


class SimpleSelfAttention(nn.Module):
    """x + γ · (X Xᵀ)(W X) over the flattened positions X (C × HW) of each sample: a C×C channel
    affinity applied to a 1×1 projection, O(C²·HW). W is spectrally normalized and γ starts at 0,
    so the layer begins as the identity and the cubic term stays bounded."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        proj = nn.Conv1d(channels, channels, kernel_size=1, bias=False)
        nn.init.kaiming_normal_(proj.weight)
        self.proj = spectral_norm(proj)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(2)  # (B, C, HW); reshapes a channels_last tensor as needed
        device = x.device.type
        if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16:
            # The cubic term passes fp16's 65504 on large activations (and 0 · inf is NaN even at γ = 0).
            with torch.autocast(device, enabled=False):
                return self._attend(x, flat.float())
        return self._attend(x, flat)

    def _attend(self, x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        affinity = torch.bmm(flat, flat.transpose(1, 2))  # (B, C, C)
        out = torch.bmm(affinity, self.proj(flat))
        return x + (self.gamma * out).view_as(x)


def add_self_attention(model: nn.Module) -> nn.Module:
    """Put a SimpleSelfAttention after the SE (or the last norm) of the last block of `layer1`, the
    place fastai's xresnet gives it. Only timm ResNet-family models have that layout. That block's SE
    becomes `se.0` (its keys `layer1.N.se.0.*`): weights saved without the layer load strictly only
    into a model without it."""
    stage, after = getattr(model, "layer1", None), getattr(model, "layer2", None)
    block = stage[-1] if isinstance(stage, nn.Sequential) and len(stage) else None
    if block is None or not hasattr(block, "se") or not isinstance(after, nn.Sequential) or not hasattr(after[0], "conv1"):
        raise UserError(
            f"model.self_attention=true: needs a timm ResNet-family model (blocks in layer1..layer4), "
            f"not {type(model).__name__}"
        )
    channels = after[0].conv1.in_channels  # what layer1 puts out
    attention = SimpleSelfAttention(channels)
    block.se = attention if block.se is None else nn.Sequential(block.se, attention)
    return model
