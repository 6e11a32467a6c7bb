"""The evaluation loop: exact top-1/top-5 and loss over every rank's val shard. It is handed built
objects and never sees the config."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable

import torch
from timm.utils import accuracy

from dali_train.distributed import DistInfo, all_reduce_sum


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: Iterable,
    *,
    device: torch.device,
    dist: DistInfo,
    amp_dtype: torch.dtype | None = None,
    max_steps: int | None = None,
    flip_tta: bool = False,
) -> dict[str, float | None]:
    """Top-1/top-5 and loss over this rank's val shard, summed as exact counts across ranks.
    `flip_tta`: of the mean logits of each image and its left-right mirror; then `top1_no_tta` is the
    top-1 of the unflipped pass alone (the leaderboards' rules forbid TTA), else None."""
    model.eval()
    # [correct@1, correct@5, loss sum, correct@1 unflipped] stay on the device (no per-batch sync);
    # float64 keeps counts exact
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    count = 0
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    for images, labels in itertools.islice(loader, max_steps):  # max_steps None: every batch
        n = labels.shape[0]
        if n == 0:  # a shorter shard's last batch, all padding (3 ranks, 50 images: 16/17/17): its 0/0
            # accuracy was NaN. No forward either: a compiled model would recompile (CUDA graphs:
            # capture) for batch 0 on this rank alone. Never the first batch, so DDP's buffer
            # broadcast (at the first forward after training only) is not skipped.
            continue
        with autocast:
            logits = model(images).float()
            unflipped = logits
            if flip_tta:  # copied first: under CUDA graphs the next call reuses the output's buffer
                unflipped = logits.clone()
                logits = (unflipped + model(images.flip(3)).float()) / 2  # dim 3: the width (NCHW view)
        top1, top5 = accuracy(logits, labels, topk=(1, 5))  # percentages of this batch
        top1_unflipped = accuracy(unflipped, labels, topk=(1,))[0] if flip_tta else top1
        loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
        totals += torch.stack([top1 * n / 100, top5 * n / 100, loss, top1_unflipped * n / 100]).double()
        count += n
    totals = torch.cat([totals, torch.tensor([float(count)], dtype=torch.float64, device=device)])
    all_reduce_sum(totals, dist)
    correct1, correct5, loss_sum, correct1_unflipped, count = totals.tolist()
    count_int = round(count)
    return {
        "top1": 100.0 * round(correct1) / max(count_int, 1),
        "top5": 100.0 * round(correct5) / max(count_int, 1),
        "loss": loss_sum / max(count_int, 1),
        "top1_no_tta": 100.0 * round(correct1_unflipped) / max(count_int, 1) if flip_tta else None,
        "samples": count_int,
    }
