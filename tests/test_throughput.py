"""Timed windows (dali_train/throughput.py) over an epoch-based loader: no window holds an epoch switch."""

from __future__ import annotations

import torch

from dali_train.throughput import Endless, timed_windows


class CountingLoader:
    """An epoch of `steps` batches; set_epoch rebuilds it, as a DALI loader's pipeline is."""

    def __init__(self, steps: int) -> None:
        self.steps, self.epochs = steps, []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        epoch = self.epochs[-1]
        return iter([(torch.full((2, 1), epoch), torch.tensor([step, step])) for step in range(self.steps)])


def test_each_window_lies_inside_one_epoch_and_the_switches_happen_outside_them():
    loader, seen = CountingLoader(steps=25), []
    batches = Endless(loader)
    result = timed_windows(
        batches, lambda x, y: seen.append((int(x[0, 0]), int(y[0]))), device=torch.device("cpu"),
        batch_size=2, world_size=1, steps=10, warmup=3, repeats=3,
    )  # fmt: skip
    # epoch 0: warm-up 3 + window 10 + window 10 (23 of 25); the third window does not fit: the rest is
    # drained, epoch 1 warmed up (3), then timed (10)
    assert loader.epochs == [0, 1] and result["epoch_switches"] == 1 and len(result["img_s_all"]) == 3
    assert seen[:23] == [(0, s) for s in range(23)] and seen[23:] == [(1, s) for s in range(13)]
