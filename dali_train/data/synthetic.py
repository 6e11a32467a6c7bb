"""Random batches made once on the training device: the model-only ceiling for throughput.

No decode, no copy: the same tensors are yielded every step, so img/s measured with this loader is
what the GPU can compute, and `e2e img/s ÷ synthetic img/s` is the share of it a real loader keeps.
timm's Mixup/CutMix mix a batch in place, so with them the same tensors drift toward their mean
over the steps: the throughput is the same, the loss means nothing (it never does here).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class SyntheticLoader:
    """Batches `(images, labels)` on `device`; see `data.Loader`."""

    def __init__(
        self,
        *,
        steps: int,
        batch_size: int,
        size: int,
        num_classes: int,
        device: torch.device,
        half: bool,
        channels_last: bool,
        seed: int,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        images = torch.randn(batch_size, 3, size, size, generator=g)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.images = images.to(device, torch.float16 if half else torch.float32).to(memory_format=memory_format)
        self.steps, self.start_step = steps, 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.start_step = start_step

    def __len__(self) -> int:
        return self.steps - self.start_step

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(len(self)):
            yield self.images, self.labels
