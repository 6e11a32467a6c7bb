"""Epoch order under sharding: coverage, equal steps, reshuffling, replay and mid-epoch resume."""

from __future__ import annotations

import numpy as np
import pytest

from dali_train.data.order import epoch_order, steps_per_epoch


@pytest.mark.parametrize("n, batch, world", [(100, 8, 1), (100, 8, 2), (101, 7, 3), (5, 4, 3)])
def test_every_file_once_plus_less_than_a_global_batch_of_repeats(n, batch, world):
    order = epoch_order(n, seed=0, epoch=0, batch_size=batch, world_size=world)
    counts = np.bincount(order.indices, minlength=n)
    assert counts.min() >= 1
    assert order.padding == len(order.indices) - n < batch * world
    assert (counts > 1).sum() <= order.padding
    blocks = [order.rank_block(r, world) for r in range(world)]
    assert {len(b) for b in blocks} == {order.steps * batch}  # equal steps on every rank
    assert order.steps == steps_per_epoch(n, batch, world)


def test_shards_change_between_epochs_and_replay_for_the_same_epoch():
    a0 = epoch_order(1000, seed=1, epoch=0, batch_size=10, world_size=2).rank_block(0, 2)
    a1 = epoch_order(1000, seed=1, epoch=1, batch_size=10, world_size=2).rank_block(0, 2)
    again = epoch_order(1000, seed=1, epoch=0, batch_size=10, world_size=2).rank_block(0, 2)
    assert len(set(a0) & set(a1)) < 0.7 * len(a0)
    np.testing.assert_array_equal(a0, again)


def test_mid_epoch_start_skips_exactly_the_trained_batches():
    full = epoch_order(200, seed=3, epoch=2, batch_size=8, world_size=2)
    rest = epoch_order(200, seed=3, epoch=2, batch_size=8, world_size=2, start_step=5)
    for r in range(2):
        np.testing.assert_array_equal(full.rank_block(r, 2)[5 * 8 :], rest.rank_block(r, 2))
