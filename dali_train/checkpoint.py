"""Checkpoints: the full training state, written atomically by rank 0, restorable exactly.

Saved unwrapped (timm's `unwrap_model`: no `module.` / `_orig_mod.` prefixes), so a checkpoint
loads into a plain, DDP-wrapped or compiled model alike. `format_version` lets later versions read older files.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.utils import unwrap_model

from dali_train.errors import UserError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class CheckpointError(UserError):
    """A checkpoint that cannot be used for this run; one line."""


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to `path` via a temp file and `os.replace`: a crash mid-write leaves the
    previous checkpoint intact, never a truncated one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save({"format_version": FORMAT_VERSION, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"trainer.resume={path}: no such file")
    try:
        # Our own files hold RNG states and config objects, not just tensors.
        state = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise CheckpointError(f"trainer.resume={path}: not a readable checkpoint ({type(e).__name__})") from None
    if not isinstance(state, dict) or "model" not in state or state.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"trainer.resume={path}: not a dali-train checkpoint of format <= {FORMAT_VERSION}")
    return state


def check_compatible(state: dict[str, Any], model: torch.nn.Module, model_name: str, path: str) -> None:
    """A clear message instead of a wall of missing/unexpected keys."""
    if state.get("model_name") not in (None, model_name):
        raise CheckpointError(
            f"trainer.resume={path}: checkpoint is of model {state['model_name']}, this run builds {model_name}"
        )
    own = unwrap_model(model).state_dict()
    theirs = state["model"]
    mismatched = [k for k in own if k not in theirs or theirs[k].shape != own[k].shape]
    if mismatched or len(theirs) != len(own):
        raise CheckpointError(
            f"trainer.resume={path}: weights do not fit {model_name} "
            f"({len(mismatched)} tensors differ, e.g. {mismatched[:2]}); was it trained with another model.name or class count?"
        )


def resolve_resume(resume: str | None, run_dir: Path) -> str | None:
    """`auto` means this run dir's last.pt if present (preemption requeue), else a fresh start."""
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        return str(last) if last.is_file() else None
    return resume


def save(path: Path, parts, dist, cfg, *, next_epoch: int, next_step: int, best_top1: float) -> None:
    """The full training state (engine.TrainParts) to `path`, written by rank 0; all ranks wait.

    Every rank's RNG state is gathered, so a multi-process resume continues each rank's streams.
    """
    import torch.distributed as torch_dist
    from omegaconf import OmegaConf

    rng = [rng_state()]
    if dist.enabled:
        rng = [None] * dist.world_size
        torch_dist.all_gather_object(rng, rng_state())
    if dist.is_main:
        save_checkpoint(
            path,
            {
                "model_name": cfg.model.name,
                "model": unwrap_model(parts.model).state_dict(),
                "ema": parts.ema.module.state_dict() if parts.ema is not None else None,
                "optimizer": parts.optimizer.state_dict(),
                "scheduler": parts.scheduler.state_dict(),
                "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
                "global_step": parts.global_step,
                "next_epoch": next_epoch,  # where a resume continues
                "next_step": next_step,  # > 0 for a mid-epoch checkpoint
                "best_top1": best_top1,
                "rng": rng,  # one entry per rank
                "config": OmegaConf.to_container(cfg, resolve=True),
            },
        )
    if dist.enabled:
        torch_dist.barrier()


def restore(path: str, parts, model_name: str) -> dict[str, Any]:
    """Load `path` into the training parts; returns the checkpoint (next_epoch, next_step, ...)."""
    state = load_checkpoint(path)
    check_compatible(state, parts.model, model_name, path)
    unwrap_model(parts.model).load_state_dict(state["model"])
    if parts.ema is not None:
        parts.ema.module.load_state_dict(state["ema"] if state.get("ema") is not None else state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scheduler.load_state_dict(state["scheduler"])
    if parts.scaler is not None and state.get("scaler") is not None:
        parts.scaler.load_state_dict(state["scaler"])
    parts.global_step = state["global_step"]
    rngs = state.get("rng") or []
    if len(rngs) == parts.dist.world_size:
        restore_rng(rngs[parts.dist.rank])
    else:
        log.warning(
            "checkpoint has RNG states of %d ranks, this run has %d: RNG streams start fresh",
            len(rngs),
            parts.dist.world_size,
        )
    state.setdefault("best_top1", float("-inf"))
    return state
