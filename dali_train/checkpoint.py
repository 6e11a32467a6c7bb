"""Checkpoints: the training state, written atomically by rank 0, read without running any code.

A file holds tensors and plain containers only (RNG states as tensors and lists, the config as a
plain dict) and is read with `torch.load(weights_only=True)`: a crafted pickle cannot execute.
Weights are saved unwrapped (timm's `unwrap_model`), so they load into a plain, DDP-wrapped or
compiled model alike; the EMA weights sit under timm's `model_ema` key.

The LR schedule is not saved: a resume builds it from the current config and positions it at the
restored optimizer step, so `trainer.epochs=2` → `3` continues on the longer schedule. Where the
position would be ambiguous (batch size, world size or accumulation changed in mid-epoch), or the
rest of the epoch would follow another order (another seed), the resume stops with one line naming
the key; at an epoch boundary it continues at that epoch. Each file is synced to disk before its
rename (`save_durably`).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.utils import unwrap_model

from dali_train.distributed import DistInfo, all_gather_lists
from dali_train.divergence import nonfinite_tensors
from dali_train.ending import DISK_FULL_ERRNOS
from dali_train.resume_fit import CheckpointError, CheckpointMeta, check_fits, load_optimizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: weights_only-loadable, no scheduler state (1 needed unsafe unpickling)
LOW_SPACE_CHECKPOINTS = 3  # warn at startup when the run dir has room for fewer checkpoints


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written; the previous one stands. `disk_full`: for lack of space (no
    space, a quota, a file size limit), the run's "disk full" ending; else (permissions, I/O) "error"."""

    def __init__(self, message: str, *, disk_full: bool) -> None:
        super().__init__(message)
        self.disk_full = disk_full


@dataclass(frozen=True)
class Resumed:
    path: str
    next_epoch: int
    next_step: int  # loader step within next_epoch; > 0 for a mid-epoch checkpoint
    global_step: int  # the schedule position the run continues at
    best_top1: float
    wall_time_s: float | None  # the run's time at the save (None: a checkpoint from before 2026-12-02)


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain lists (weights_only-loadable)."""
    version, internal, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        # this process's device only: a resume may see fewer GPUs (8 saved, 1 visible)
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # checkpoints before 2026-12-01 saved every visible device's state
        cuda = (
            cuda[torch.cuda.current_device()]
            if torch.cuda.is_available() and len(cuda) > torch.cuda.current_device()
            else None
        )
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)  # the current device: this rank's, set by select_device


def tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in nested dicts/lists: about the size of the file they are saved to."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def read_checkpoint(path: str | Path, key: str = "trainer.resume") -> dict[str, Any]:
    """A file written by torch.save, read with weights_only=True; any failure is one line naming `key`."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{key}={path}: no such file")
    if p.stat().st_size == 0:
        raise CheckpointError(
            f"{key}={path}: empty file (a machine crash while it was written?); try the other checkpoint of "
            f"its folder (best.pt or last.pt)"
        )
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure means "not a checkpoint we can read safely"
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        # torch.save writes a zip: a file that is none, or whose zip torch cannot read, is damaged (cut
        # short, say); a whole zip refused by the weights-only unpickler holds pickled code
        if isinstance(e, RuntimeError) or not zipfile.is_zipfile(p):
            raise CheckpointError(
                f"{key}={path}: a damaged or incomplete file, or not a torch checkpoint ({type(e).__name__}: "
                f"{reason}); try the other checkpoint of its folder (best.pt or last.pt)"
            ) from None
        raise CheckpointError(
            f"{key}={path}: not a checkpoint readable without running code ({type(e).__name__}: {reason})"
        ) from None


def save_durably(state: dict[str, Any], tmp: Path, path: Path) -> None:
    """torch.save to `tmp`, then rename it to `path`, each synced to disk first: after a machine crash
    (power, a node lost) a file system may keep the rename but not the data, an empty `path` in
    place of the previous checkpoint, which every requeue would then fail to read."""
    with open(tmp, "wb") as f:  # a Python file: a failed write's OSError (errno) becomes the context of torch's error
        torch.save(state, f)
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)  # the rename itself


def _fsync(file_or_dir: Path) -> None:
    fd = os.open(file_or_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a directory on a file system that cannot sync one (EINVAL): nothing to do
        if not file_or_dir.is_dir():
            raise
        log.debug("fsync %s: %s", file_or_dir, e)
    finally:
        os.close(fd)


def _os_error(e: BaseException) -> OSError | None:
    """The OSError behind a failed save: `e` itself, or what torch's writer error was raised during
    (its own message, "unexpected pos", names no errno)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def _file_system_free(directory: Path) -> int:
    while not directory.exists():
        directory = directory.parent
    return shutil.disk_usage(directory).free


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class Checkpointer:
    """Owns `run_dir/checkpoints/`: stale temp files, the free-space check, save and restore."""

    def __init__(self, run_dir: Path, dist: DistInfo, meta: CheckpointMeta) -> None:
        self.dir, self.dist, self.meta = Path(run_dir) / "checkpoints", dist, meta

    def path(self, name: str) -> Path:
        return self.dir / name

    def prepare(self, parts) -> None:
        """At startup: rank 0 removes temp files of killed writers and checks that the folder takes a
        file (else the first save, an epoch in, lost that epoch), and every rank raises what it found
        (a collective: the other ranks would wait in their first one for a rank 0 that had left);
        then a warning when the disk is nearly full."""
        problem = self._check_folder() if self.dist.is_main else None
        if self.dist.enabled and torch.distributed.is_initialized():  # (a test standing in for a rank has no group)
            problem = all_gather_lists([problem], self.dist)[0]
        if problem is not None:
            error, message = problem
            raise CheckpointWriteError(message, disk_full=True) if error == "disk full" else CheckpointError(message)
        if not self.dist.is_main:
            return
        need, free = self.estimate_bytes(parts), _file_system_free(self.dir)
        if free < LOW_SPACE_CHECKPOINTS * need:
            log.warning(
                "%s: %s free, less than %d checkpoints of about %s each: a checkpoint write may fail",
                self.dir,
                _mb(free),
                LOW_SPACE_CHECKPOINTS,
                _mb(need),
            )

    def _check_folder(self) -> tuple[str, str] | None:
        """(kind, message) when the folder cannot take a checkpoint; kind "disk full" or "error"."""
        probe = self.dir / f".write-check-{os.getpid()}"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for stale in sorted(self.dir.glob(".*.tmp-*")):
                stale.unlink(missing_ok=True)
                log.warning("removed %s, a checkpoint write that did not finish", stale)
            try:
                probe.write_bytes(b"dali-train")
            finally:
                probe.unlink(missing_ok=True)
        except OSError as e:
            kind = "disk full" if e.errno in DISK_FULL_ERRNOS else "error"
            return kind, f"{self.dir}: checkpoints cannot be written there ({e.strerror or e})"
        return None

    @staticmethod
    def estimate_bytes(parts) -> int:
        """Model (+ EMA) + optimizer state; before the first step the optimizer state is assumed to be
        two tensors per parameter (Adam's), an upper bound for SGD's one."""
        model = tensor_bytes(unwrap_model(parts.model).state_dict())
        ema = tensor_bytes(parts.ema.module.state_dict()) if parts.ema is not None else 0
        opt = tensor_bytes(parts.optimizer.state_dict()["state"])
        if not opt:
            opt = 2 * sum(p.numel() * p.element_size() for p in parts.model.parameters())
        return model + ema + opt

    def resolve(self, resume: str | None) -> str | None:
        """`auto` means this run dir's last.pt if present (preemption requeue), else a fresh start."""
        if resume == "auto":
            last = self.path("last.pt")
            return str(last) if last.is_file() else None
        return resume

    def save(
        self, name: str, parts, *, next_epoch: int, next_step: int, best_top1: float, wall_time_s: float | None = None
    ) -> None:
        """The training state (engine.TrainParts) to checkpoints/`name`, written by rank 0; all ranks wait.

        Every rank's RNG state is gathered, so a multi-process resume continues each rank's streams.
        """
        import torch.distributed as torch_dist

        rng = [rng_state()]
        if self.dist.enabled:
            rng = [None] * self.dist.world_size
            torch_dist.all_gather_object(rng, rng_state())
        if self.dist.is_main:
            state = {
                "format_version": FORMAT_VERSION,
                **asdict(self.meta),
                "model": unwrap_model(parts.model).state_dict(),
                "model_ema": parts.ema.module.state_dict() if parts.ema is not None else None,
                "optimizer": parts.optimizer.state_dict(),
                "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
                "global_step": parts.global_step,
                "next_epoch": next_epoch,  # where a resume continues
                "next_step": next_step,  # > 0 for a mid-epoch checkpoint
                "best_top1": best_top1,
                "wall_time_s": wall_time_s,  # a resume's clock goes on from here (None: from the last epoch row)
                "rng": rng,  # one entry per rank
            }
            self._write(self.path(name), state)
        if self.dist.enabled:
            torch_dist.barrier()

    def _write(self, path: Path, state: dict[str, Any]) -> None:
        """Via a temp file and `os.replace`: a crash mid-write leaves the previous file intact; a
        failed write (disk full) removes the temp file and names the path and the bytes needed."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            save_durably(state, tmp, path)
        except (OSError, RuntimeError) as e:
            tmp.unlink(missing_ok=True)
            cause = _os_error(e)
            reason = cause.strerror if cause and cause.strerror else str(e).strip().splitlines()[-1][-120:]
            raise CheckpointWriteError(
                f"could not write {path}: it needs about {_mb(tensor_bytes(state))}, "
                f"{_mb(_file_system_free(path.parent))} free there ({reason}); "
                + (f"the previous {path.name} is kept" if path.exists() else f"there is no earlier {path.name}"),
                disk_full=cause is not None and cause.errno in DISK_FULL_ERRNOS,
            ) from None

    def restore(self, path: str, parts, *, eval_only: bool = False) -> Resumed:
        """Load `path` into the training parts and position the schedule (see the module docstring).
        `eval_only`: a checkpoint with EMA weights evaluates them, as best.pt was chosen on them."""
        state = read_checkpoint(path)
        if not isinstance(state, dict) or "model" not in state or state.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"trainer.resume={path}: not a dali-train checkpoint of format {FORMAT_VERSION} "
                f"(to start from its weights, use model.pretrained={path})"
            )
        check_fits(state, self.meta, parts.model, path, eval_only=eval_only)
        ema_only = parts.ema is None and state["model_ema"] is not None  # its best.pt and top-1 are the EMA's
        if ema_only and not eval_only:
            raise CheckpointError(
                f"trainer.ema=false: trainer.resume={path} was trained with trainer.ema=true (its top-1 is its EMA "
                f"weights'); resume with trainer.ema=true, or start from its EMA weights with model.pretrained={path}"
            )
        unwrap_model(parts.model).load_state_dict(state["model_ema"] if ema_only else state["model"])
        if ema_only:
            log.info("trainer.resume=%s holds EMA weights: evaluating those (as its top-1 and best.pt were)", path)
        if parts.ema is not None:
            parts.ema.module.load_state_dict(state["model_ema"] if state["model_ema"] is not None else state["model"])
            if state["model_ema"] is None and not eval_only:
                log.warning(
                    "trainer.ema=true: trainer.resume=%s has no EMA weights; the EMA starts from its weights, and its "
                    "best top-1 (%.2f), which best.pt is kept against, is the raw model's", path, state["best_top1"],
                )  # fmt: skip
        # No checkpoint is written with a NaN/inf weight (fit.py checks first): one is a damaged file,
        # whose training would end "diverged", blaming the LR.
        if (bad := nonfinite_tensors([unwrap_model(parts.model), parts.ema], self.dist)) > 0:
            raise CheckpointError(
                f"trainer.resume={path}: {bad} weight tensor(s) hold NaN/inf, which no checkpoint is saved with: "
                f"a damaged file; try the other checkpoint of its folder (best.pt or last.pt)"
            )
        next_epoch, next_step = state["next_epoch"], state["next_step"]
        global_step = state["global_step"]
        if eval_only:  # the weights only: no optimizer state, schedule position or RNG streams to continue
            return Resumed(path, next_epoch, next_step, global_step, state["best_top1"], state.get("wall_time_s"))
        load_optimizer(parts.optimizer, state["optimizer"], path)
        if parts.scaler is not None and state["scaler"] is not None:
            parts.scaler.load_state_dict(state["scaler"])
        if state["updates_per_epoch"] != self.meta.updates_per_epoch:  # mid-epoch: fewer steps or files only
            global_step = next_epoch * self.meta.updates_per_epoch + next_step // self.meta.grad_accum_steps
            log.warning(
                "updates per epoch changed from %d to %d (batch size, world size, accumulation, "
                "trainer.max_steps_per_epoch or data): the schedule continues at epoch %d step %d, update %d",
                state["updates_per_epoch"],
                self.meta.updates_per_epoch,
                next_epoch,
                next_step,
                global_step,
            )
        parts.global_step = global_step
        parts.scheduler.step_update(num_updates=global_step)
        rngs = state["rng"] or []
        if len(rngs) == self.dist.world_size:
            restore_rng(rngs[self.dist.rank])
        else:
            log.warning(
                "checkpoint has RNG states of %d ranks, this run has %d: RNG streams start fresh",
                len(rngs),
                self.dist.world_size,
            )
        return Resumed(path, next_epoch, next_step, global_step, state["best_top1"], state.get("wall_time_s"))
