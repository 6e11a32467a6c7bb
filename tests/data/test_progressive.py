"""Progressive resizing: the size of each epoch (unit tests of progressive_size), and its ramp
checked against trainer.epochs."""

from __future__ import annotations

import itertools

import pytest

from dali_train.config import DataConfig, ProgressiveConfig
from dali_train.data import progressive_size
from tests.data.test_loaders import make_cfg


def sizes(start: int, end: int, step: int, *, start_epoch: int = 0, end_epoch: int = 3, epochs: int = 5) -> list[int]:
    ramp = ProgressiveConfig(True, start, end, start_epoch, end_epoch, step)
    size = progressive_size(DataConfig(name="unit", root="unused", progressive=ramp))
    return [size(epoch) for epoch in range(epochs)]


@pytest.mark.parametrize(
    "start, end, step, expected",
    [
        (32, 56, 16, [32, 48, 48, 56, 56]),  # round() to even: 32 at epoch 1, and 64 (above end_size) from epoch 3
        (40, 40, 16, [40] * 5),  # round() to even: 32 throughout
        (56, 32, 16, [56, 48, 48, 32, 32]),  # a shrinking ramp: 64 at epoch 0
        (160, 192, 32, [160, 160, 192, 192, 192]),  # multiples of step: FFCV's 160 -> 192
    ],
)
def test_ends_off_the_step_are_trained_at_exactly(start, end, step, expected):
    """start_size up to start_epoch, end_size from end_epoch on, in between the nearest multiple of
    step, halves up: Python's round() (to even) trained above end_size or below start_size."""
    assert sizes(start, end, step) == expected


def test_a_step_change_at_one_epoch_trains_end_size_from_that_epoch():
    """start_epoch == end_epoch (allowed): the start check came first, so end_size began an epoch late."""
    assert sizes(128, 192, 32, start_epoch=2, end_epoch=2) == [128, 128, 192, 192, 192]


def test_the_ramp_never_leaves_its_ends():
    for start, end, step in itertools.product((24, 40, 57, 100), (40, 56, 100), (8, 16, 32)):
        if min(start, end) < step:  # refused by the config
            continue
        got = sizes(start, end, step, start_epoch=1, end_epoch=6, epochs=9)
        assert got[:2] == [start] * 2 and got[6:] == [end] * 3, (start, end, step, got)
        assert all(min(start, end) <= s <= max(start, end) for s in got), (start, end, step, got)
        assert all(s % step == 0 for s in got[2:6] if s not in (start, end)), (start, end, step, got)


def test_a_ramp_past_the_last_epoch_is_a_warning(caplog):
    """end_epoch 10 (the default) with trainer.epochs=4 never reached end_size, without a word."""
    ramp = ["data.progressive.enabled=true", "trainer.epochs=4"]
    with caplog.at_level("WARNING", logger="dali_train.config"):
        make_cfg("unused", *ramp)
    assert caplog.messages == [
        "data.progressive.end_epoch=10: past the last epoch, 3 (trainer.epochs=4): the train crop never "
        "reaches data.progressive.end_size=192"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="dali_train.config"):
        make_cfg("unused", *ramp, "data.progressive.end_epoch=3")
    assert caplog.messages == []
