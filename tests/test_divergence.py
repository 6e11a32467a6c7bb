"""LossWatch on real tensors: what the epoch loop reports without syncing per step."""

from __future__ import annotations

import math

import torch

from dali_train.distributed import DistInfo
from dali_train.divergence import LossWatch

ONE = DistInfo(0, 0, 1)


def test_loss_watch_sums_the_finite_losses_and_names_the_first_bad_one_across_a_grown_window():
    watch = LossWatch(torch.device("cpu"))
    losses = [float(i) for i in range(100)]  # more than the first window (64) between two checks
    losses[70], losses[80] = math.nan, math.inf
    for i, loss in enumerate(losses):
        watch.add(torch.tensor(loss), step=i + 1, update=i + 1, lr=0.5)
    diverged = watch.check(ONE, epoch=3)
    assert diverged is not None and diverged.update == 71
    assert "epoch 3 step 71 (update 71)" in str(diverged) and "last finite loss 69" in str(diverged)
    finite = [v for v in losses if math.isfinite(v)]
    assert watch.totals().tolist() == [sum(finite), len(finite)]
    watch.add(torch.tensor(2.0), step=101, update=101, lr=0.5)  # a clean window after a check
    assert watch.check(ONE, epoch=3) is None and watch.pending == []
    assert watch.totals().tolist() == [sum(finite) + 2.0, len(finite) + 1]
    watch.add(torch.tensor(math.nan), step=102, update=102, lr=0.5)  # first in its window: the last finite is older
    assert "last finite loss 2" in str(watch.check(ONE, epoch=3))
