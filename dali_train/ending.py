"""How a run ended: one state for summary.json and the last log line, an exit code, one line.

| end_state | exit code |
|---|---|
| `completed` | 0 |
| `job done` (`trainer.epochs_per_job` epochs done, more remain: resume continues) | 0 |
| `stopped by signal` (SIGTERM, SIGINT, SIGUSR2) | 128 + signal number |
| `diverged at step N` (N: the optimizer update, as in steps.jsonl) | 2 |
| `disk full`, `bad file`, `out of memory`, `collective timed out`, `error` (any other UserError) | 2 |
| `crashed` (a bug: the traceback is kept) | 1 |
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dali_train.data import DatasetError
from dali_train.divergence import Diverged
from dali_train.errors import OutOfMemory, UserError

EXIT_USER = 2  # one line on stderr starting with `error:`; also Hydra's composition errors


@dataclass(frozen=True)
class Ending:
    state: str  # summary.json's end_state
    exit_code: int
    message: str = ""  # one line; empty when completed
    hand_over: Callable[[], None] | None = None  # run after summary.json is written (submitit's requeue)


@dataclass(frozen=True)
class RunShape:
    """What an out-of-memory message names."""

    model: str
    batch_size: int  # per process
    grad_accum_steps: int
    device: torch.device | None  # None before it was chosen


COMPLETED = Ending("completed", 0)


def job_done(epochs_done: int, epochs: int, run_dir: Path) -> Ending:
    """A job of `trainer.epochs_per_job` epochs ended as planned, before the run's last epoch. The
    next job must name this dir: a plain rerun gets a new timestamped one, with no last.pt."""
    return Ending(
        "job done",
        0,
        f"{epochs_done} of {epochs} epochs done; continue: the same command with trainer.resume=auto "
        f"hydra.run.dir={run_dir}",
    )


def stopped_by_signal(signum: int, message: str, hand_over: Callable[[], None] | None = None) -> Ending:
    return Ending("stopped by signal", 128 + signum, message, hand_over)


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # no space, a file size limit, a quota


def _disk_full(e: BaseException) -> bool:
    try:  # dali_train.checkpoint's class for a checkpoint that could not be written, where it exists
        from dali_train.checkpoint import CheckpointWriteError
    except ImportError:
        CheckpointWriteError = ()  # noqa: N806 - an empty tuple matches nothing in isinstance
    if isinstance(e, CheckpointWriteError):
        return e.disk_full
    return isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS


# What torch's backends say when a collective waited past its timeout: gloo ("Timed out waiting
# 1800000ms for recv operation", or, when the timeout closes the connection first, "Application
# timeout caused pair closure"), NCCL's watchdog ("Watchdog caught collective operation timeout").
# Not any "timeout": a CUDA launch that "timed out" or a file system's is another error.
_COLLECTIVE_TIMEOUT_MARKERS = ("Timed out waiting", "Application timeout caused pair closure", "collective operation timeout")


def _collective_timeout(e: BaseException) -> bool:
    """A timeout of a collective: only where there is a process group (another timeout is a bug)."""
    if not (isinstance(e, RuntimeError) and torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    return any(marker in str(e) for marker in _COLLECTIVE_TIMEOUT_MARKERS)


def oom_message(shape: RunShape, gpu_bytes: int | None) -> str:
    memory = f"the GPU has {gpu_bytes / 2**30:.1f} GiB" if gpu_bytes else "no CUDA device reports its memory"
    return (
        f"CUDA out of memory: model {shape.model} with loader.batch_size={shape.batch_size} per GPU does not fit "
        f"({memory}); lower loader.batch_size and raise trainer.grad_accum_steps (now {shape.grad_accum_steps}) "
        f"to keep the global batch, keep trainer.channels_last=true and trainer.amp=bf16 or fp16"
    )


def ending_for(e: BaseException, shape: RunShape, dist_timeout_s: float, *, training: bool) -> Ending | None:
    """The ending for an exception that stopped the run, or None for a bug (keep its traceback).
    `training`: the loop had started (a DatasetError before it is about the folder, not a file)."""
    if isinstance(e, Diverged):
        return Ending(f"diverged at step {e.update}", EXIT_USER, str(e))
    if _disk_full(e):
        return Ending("disk full", EXIT_USER, str(e))
    if isinstance(e, torch.cuda.OutOfMemoryError):
        gpu = (
            torch.cuda.get_device_properties(shape.device).total_memory
            if shape.device and shape.device.type == "cuda"
            else None
        )
        return Ending("out of memory", EXIT_USER, oom_message(shape, gpu))
    if isinstance(e, OutOfMemory):  # foreseen at startup: its own message names the keys
        return Ending("out of memory", EXIT_USER, str(e))
    if isinstance(e, DatasetError) and training:
        return Ending("bad file", EXIT_USER, str(e))
    if isinstance(e, UserError):
        return Ending("error", EXIT_USER, str(e))
    if _collective_timeout(e):
        return Ending(
            "collective timed out",
            EXIT_USER,
            f"waited trainer.dist_timeout_s={dist_timeout_s:g} s for the other ranks in a collective: one stopped, "
            f"hung or died (see its log); raise trainer.dist_timeout_s if a rank legitimately takes that long "
            f"({str(e).strip().splitlines()[0][-200:]})",
        )
    return None
