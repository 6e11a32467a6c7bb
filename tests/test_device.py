"""configure_backends: the precision and autotune switches reach torch's backends."""

from __future__ import annotations

import pytest
import torch

from dali_train.device import configure_backends


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
