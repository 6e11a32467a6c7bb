"""Non-finite losses and weights: found without extra host syncs, never saved into a checkpoint.

The loss of every micro-batch is recorded on the device (no sync); the host looks at the record
where it syncs anyway (log intervals, before a save, at the end of an epoch). The fp16 GradScaler's
skipped updates (scaled gradients overflowed, the loss itself finite) are not divergence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from dali_train.distributed import DistInfo, all_reduce_sum

FIXES = "lower optimizer.lr, set trainer.clip_grad_norm, or allow trainer.max_nonfinite_skips"


class Diverged(Exception):
    """The loss or the weights became NaN/inf; its text is one line. `update`: the optimizer
    step (as in steps.jsonl and TensorBoard) at which it was found."""

    def __init__(self, message: str, update: int) -> None:
        super().__init__(message)
        self.update = update


class LossWatch:
    """This epoch's train losses on the device: the sum and count of the finite ones, the last
    finite one, and the first non-finite one since the last `check` (an index into `pending`,
    the host's (epoch step, update, lr) of each micro-batch since then)."""

    def __init__(self, device: torch.device) -> None:
        self.sum = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.float64, device=device)
        self.last_finite = torch.full((), math.nan, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.pending: list[tuple[int, int, float]] = []

    def add(self, loss: torch.Tensor, *, step: int, update: int, lr: float) -> None:
        """Record one micro-batch's loss; no host sync."""
        loss = loss.detach().float()
        finite = torch.isfinite(loss)
        self.sum += torch.where(finite, loss, 0.0).double()
        self.count += finite.double()
        self.last_finite = torch.where(finite & (self.first_bad < 0), loss, self.last_finite)
        self.first_bad = torch.where(~finite & (self.first_bad < 0), len(self.pending), self.first_bad)
        self.pending.append((step, update, lr))

    def mean(self) -> torch.Tensor:
        return self.sum / self.count.clamp(min=1)

    def check(self, dist: DistInfo, *, epoch: int, what: str = "loss") -> Diverged | None:
        """Host sync (a collective under DDP, at the same step on every rank): a Diverged for
        the first non-finite loss on any rank since the last check, or None; clears `pending`."""
        bad_here = int(self.first_bad.item())
        any_bad = all_reduce_sum(torch.tensor([float(bad_here >= 0)]), dist).item() > 0
        pending, self.pending = self.pending, []
        self.first_bad.fill_(-1)
        if not any_bad:
            return None
        last = self.last_finite.item()
        if bad_here >= 0:
            step, update, lr = pending[bad_here]
            where = f"epoch {epoch} step {step} (update {update})"
        else:  # another rank's loss; the gradients all ranks share are now non-finite too
            step, update, lr = pending[-1]
            where = f"another rank, found at epoch {epoch} step {step} (update {update})"
        return Diverged(
            f"the {what} became NaN/inf at {where}, lr {lr:.4g} at that step; last finite loss {last:.4g}; {FIXES}",
            update,
        )


def nonfinite_tensors(modules: Iterable[torch.nn.Module | None], dist: DistInfo) -> int:
    """How many floating-point weights/buffers are not all finite, summed over ranks (a
    collective and a host sync: called before a checkpoint is written)."""
    tensors = [t for m in modules if m is not None for t in m.state_dict().values() if torch.is_floating_point(t)]
    if not tensors:
        return 0
    bad = torch.stack([~torch.isfinite(t).all() for t in tensors]).sum().float().reshape(1)
    return round(all_reduce_sum(bad.cpu(), dist).item())
