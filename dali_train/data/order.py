"""Which training file each rank reads in each epoch: one seeded permutation, cut into equal shards.

Every rank computes the same permutation of the N training files from (seed, epoch), pads it by
repeating its first items up to a multiple of the global batch, and cuts it into `world_size`
contiguous shards of equal length. So:
- every file is read at least once per epoch; fewer than one global batch (`world_size ×
  batch_size`) of files are read twice (`padding` below), none are dropped;
- every rank runs the same number of steps, so DDP never waits on a rank that has run out;
- shards change every epoch (a fresh permutation), yet an epoch's order replays exactly on resume,
  since it depends only on (seed, epoch) and the number of files;
- a resume in the middle of an epoch skips the batches already trained (`start_step`).
DALI's reader then shards this list with `shard_id=rank, num_shards=world_size`: its contiguous
split of a list of `world_size` equal blocks gives each rank exactly its block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpochOrder:
    indices: np.ndarray  # into the file list; `world_size` equal contiguous blocks, one per rank
    steps: int  # batches per rank in a full epoch
    padding: int  # files read twice this epoch to fill the last global batch

    def rank_block(self, rank: int, world_size: int) -> np.ndarray:
        size = len(self.indices) // world_size
        return self.indices[rank * size : (rank + 1) * size]


def steps_per_epoch(num_files: int, batch_size: int, world_size: int) -> int:
    return -(-num_files // (batch_size * world_size))


def padding_per_epoch(num_files: int, batch_size: int, world_size: int) -> int:
    """Files read twice per epoch to fill the last global batch (fewer than one global batch)."""
    return steps_per_epoch(num_files, batch_size, world_size) * batch_size * world_size - num_files


def epoch_order(
    num_files: int, *, seed: int, epoch: int, batch_size: int, world_size: int, start_step: int = 0
) -> EpochOrder:
    steps = steps_per_epoch(num_files, batch_size, world_size)
    if not 0 <= start_step < steps:
        raise ValueError(f"start_step={start_step} outside the epoch's {steps} steps")
    perm = np.random.default_rng([seed, epoch]).permutation(num_files)
    padded = np.resize(perm, steps * batch_size * world_size)  # np.resize repeats from the start
    blocks = padded.reshape(world_size, steps * batch_size)[:, start_step * batch_size :]
    return EpochOrder(blocks.reshape(-1), steps, padding_per_epoch(num_files, batch_size, world_size))


def contiguous_shard(num_files: int, rank: int, world_size: int) -> range:
    """Indices of rank's validation shard: DALI's reader split (`shard_id`, `num_shards`) of an
    unshuffled list into contiguous parts whose sizes differ by at most one."""
    return range(num_files * rank // world_size, num_files * (rank + 1) // world_size)
