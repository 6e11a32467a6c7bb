"""This process's device and numeric setup: which device, which autocast dtype, which backend flags."""

from __future__ import annotations

import os

import torch

from dali_train.distributed import DistInfo
from dali_train.errors import UserError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}  # trainer.amp -> autocast dtype


def set_cuda_max_connections(connections: int) -> str | None:
    """Set CUDA_DEVICE_MAX_CONNECTIONS unless the user's environment has it; call before CUDA starts.

    DALI's many small copies and kernels otherwise queue behind the model's kernels in CUDA's 8
    hardware work queues (H200: 32 queues lifted ResNet-18 e2e from 77% to 91% of model-only, 1 queue
    dropped it to 3-4k img/s). Returns the value in effect (None: CUDA's default)."""
    if connections > 0 and not os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"):
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") or None


def select_device(name: str, dist: DistInfo) -> torch.device:
    """`trainer.device` (auto | cpu | cuda) on this rank: its local GPU, or the CPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("trainer.device=cuda: no CUDA device is visible; use trainer.device=cpu or auto")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    device = torch.device("cuda", gpu_of_rank(dist.local_rank, torch.cuda.device_count()))
    torch.cuda.set_device(device)  # this rank's GPU for NCCL and DALI (starts the CUDA context)
    return device


def gpu_of_rank(local_rank: int, visible: int) -> int:
    """This rank's GPU index: its local rank; or 0 where each process sees one GPU (SLURM binding a
    GPU per task: `--gpus-per-task=1`, submitit's gpus_per_task). More ranks on a node than GPUs
    would put two on one GPU (NCCL refuses that mid-setup; anything else trains them at half
    speed): one line instead."""
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise UserError(
            f"local rank {local_rank}, but this node has {visible} visible GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): start at most "
            f"{visible} processes per node (torchrun --nproc_per_node={visible})"
        )
    return local_rank


def amp_dtype_for(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype of `trainer.amp`; fp32 on CPU, where bf16 autocast is slow on most CPUs."""
    return AMP_DTYPES[name] if device.type == "cuda" else None


def configure_backends(device: torch.device, *, deterministic: bool, cudnn_benchmark: bool, tf32: bool = True) -> None:
    # Set both ways: the jobs of a sweep share the process, and a deterministic job's setting stayed on
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_benchmark and not deterministic
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
