"""The training loss: cross-entropy with label smoothing, or soft-target CE under Mixup/CutMix."""

from __future__ import annotations

from collections.abc import Callable

import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy


def build_loss(
    *, label_smoothing: float, mixup_alpha: float, cutmix_alpha: float, num_classes: int
) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], Mixup | None]:
    """(train loss, mixup or None): soft-target CE when Mixup/CutMix mixes labels (the smoothing
    then goes into the mixed targets), plain CE with label smoothing otherwise."""
    if mixup_alpha or cutmix_alpha:
        mixup = Mixup(
            mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, label_smoothing=label_smoothing, num_classes=num_classes
        )
        return SoftTargetCrossEntropy(), mixup
    return torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing), None
