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
    """This epoch's train losses, kept on the device: each micro-batch's loss is copied into a
    window (one kernel per step: in an eager, launch-bound loop every kernel counts; the finite
    checks used to launch ~18), and `check` looks at the window where the host syncs anyway. `pending`:
    the host's (epoch step, update, lr) of each loss in the window."""

    def __init__(self, device: torch.device) -> None:
        self.sum = torch.zeros((), dtype=torch.float64, device=device)  # of the finite losses folded so far
        self.count = torch.zeros((), dtype=torch.float64, device=device)
        self.last_finite = math.nan  # the last finite loss before the first non-finite one (host)
        self.pending: list[tuple[int, int, float]] = []
        self._window = torch.empty(64, dtype=torch.float32, device=device)
        self._folded = 0  # window entries already in sum/count

    def add(self, loss: torch.Tensor, *, step: int, update: int, lr: float) -> None:
        """Record one micro-batch's loss; no host sync."""
        n = len(self.pending)
        if n == len(self._window):  # more steps between checks than the window holds: double it
            self._window = torch.cat([self._window, torch.empty_like(self._window)])
        self._window[n] = loss.detach()
        self.pending.append((step, update, lr))

    def totals(self) -> torch.Tensor:
        """[sum, count] of this epoch's finite losses, on the device; no host sync."""
        n = len(self.pending)
        if n > self._folded:
            window = self._window[self._folded : n]
            finite = torch.isfinite(window)
            self.sum += torch.where(finite, window, 0.0).sum(dtype=torch.float64)
            self.count += finite.sum(dtype=torch.float64)
            self._folded = n
        return torch.stack([self.sum, self.count])

    def check(self, dist: DistInfo, *, epoch: int, what: str = "loss") -> Diverged | None:
        """Host sync (a collective under DDP, at the same step on every rank): a Diverged for
        the first non-finite loss on any rank since the last check, or None; clears `pending`."""
        self.totals()
        window = self._window[: len(self.pending)].cpu()
        bad = (~torch.isfinite(window)).nonzero().flatten().tolist()
        bad_here = bad[0] if bad else -1
        any_bad = all_reduce_sum(torch.tensor([float(bad_here >= 0)]), dist).item() > 0
        finite_before = window[: bad_here if bad_here >= 0 else len(window)]
        if len(finite_before):
            self.last_finite = finite_before[-1].item()
        pending, self.pending, self._folded = self.pending, [], 0
        if not any_bad:
            return None
        if bad_here >= 0:
            step, update, lr = pending[bad_here]
            where = f"epoch {epoch} step {step} (update {update})"
        else:  # another rank's loss; the gradients all ranks share are now non-finite too
            step, update, lr = pending[-1]
            where = f"another rank, found at epoch {epoch} step {step} (update {update})"
        return Diverged(
            f"the {what} became NaN/inf at {where}, lr {lr:.4g} at that step; last finite loss "
            f"{self.last_finite:.4g}; {FIXES}",
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
