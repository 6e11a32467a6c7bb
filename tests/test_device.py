"""configure_backends: the precision and autotune switches reach torch's backends."""

from __future__ import annotations

import pytest
import torch

from dali_train.device import configure_backends, gpu_of_rank
from dali_train.errors import UserError


@pytest.fixture
def restore_backends():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


@pytest.mark.usefixtures("restore_backends")
def test_tf32_false_keeps_fp32_matmuls_and_convolutions_in_full_precision():
    cuda = torch.device("cuda", 0)  # the flags are process-wide; setting them needs no GPU
    configure_backends(cuda, deterministic=False, cudnn_benchmark=True, tf32=True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.benchmark
    configure_backends(cuda, deterministic=False, cudnn_benchmark=False, tf32=False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cudnn.benchmark


def test_each_rank_gets_its_own_gpu_and_more_ranks_than_gpus_is_one_line():
    assert [gpu_of_rank(r, 2) for r in (0, 1)] == [0, 1]
    assert [gpu_of_rank(r, 1) for r in range(4)] == [0, 0, 0, 0]  # one GPU bound to each task (SLURM)
    with pytest.raises(UserError, match=r"local rank 2, but this node has 2 visible GPU\(s\).*--nproc_per_node=2") as e:
        gpu_of_rank(2, 2)  # it was GPU 0 again, beside rank 0
    assert "\n" not in str(e.value)


def test_a_deterministic_job_does_not_leave_the_next_job_of_its_sweep_deterministic():
    """A multirun's jobs share the process: the setting was switched on, never off."""
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        configure_backends(torch.device("cpu"), deterministic=True, cudnn_benchmark=False)
        assert torch.are_deterministic_algorithms_enabled()
        configure_backends(torch.device("cpu"), deterministic=False, cudnn_benchmark=False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
