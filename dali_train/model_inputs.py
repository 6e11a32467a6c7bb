"""The image sides a run feeds its model, checked at startup: against a model that takes one side
only (timm's ViT, DeiT, Swin, Mixer and kin assert it at their first forward, which for
validation's side came after the first epoch's training, a crash that lost it, and for progressive
resizing's sides epochs later), and progressive resizing's largest crop against the GPU's memory
(which the first step, at the ramp's smaller start, does not try)."""

from __future__ import annotations

import inspect
import logging
import types

import torch
from timm.utils import unwrap_model
from torch.nn.modules.batchnorm import _BatchNorm

from dali_train.config import DataConfig
from dali_train.data import progressive_size
from dali_train.distributed import all_reduce_max
from dali_train.engine import TrainParts, autocast_for
from dali_train.errors import OutOfMemory
from dali_train.models import ModelError

log = logging.getLogger(__name__)


def fixed_input_side(model: torch.nn.Module) -> tuple[int, int] | None:
    """The (H, W) the model accepts only, or None: its input patch embedding (`patch_embed`, or a
    Mixer's `stem`, where timm's own fixed-size test looks) with `strict_img_size` set. Only that
    one: a later stage's (visformer's, behind a strided stem) names another side."""
    bare = unwrap_model(model)  # DDP's and compile's wrappers off
    embed = getattr(bare, "patch_embed", None) or getattr(bare, "stem", None)
    if getattr(embed, "strict_img_size", False) and getattr(embed, "img_size", None):
        return tuple(embed.img_size)
    return None


def run_input_sides(data: DataConfig, *, epochs: int, eval_only: bool, progressive: bool = True) -> dict[str, int]:
    """Config key (with the epoch, under progressive resizing) -> the square side it feeds the model.
    `progressive`: whether the loader follows data.progressive (loader=synthetic does not)."""
    sides = {"data.val_size": data.val_size}
    if eval_only:
        return sides
    if not (progressive and data.progressive.enabled):
        return sides | {"data.train_size": data.train_size}
    size_at = progressive_size(data)
    for epoch in range(epochs):
        if epoch == 0 or size_at(epoch) not in sides.values():
            sides[f"data.progressive (epoch {epoch})"] = size_at(epoch)
    return sides


def check_input_sides(model: torch.nn.Module, model_name: str, sides: dict[str, int]) -> None:
    """A ModelError naming the keys whose side a fixed-size model would reject."""
    fixed = fixed_input_side(model)
    wrong = {key: side for key, side in sides.items() if fixed is not None and (side, side) != fixed}
    if wrong:
        what = ", ".join(f"{key}={side}" for key, side in wrong.items())
        takes = inspect.signature(type(unwrap_model(model))).parameters
        build = "model.kwargs.img_size=N" + (" or model.kwargs.dynamic_img_size=true" if "dynamic_img_size" in takes else "")
        raise ModelError(
            f"model.name={model_name} takes {fixed[0]}x{fixed[1]} px images only, not {what}: set them to "
            f"{fixed[0]}, or build the model for them ({build})"
        )


def check_largest_crop_fits(
    parts: TrainParts, model_name: str, data: DataConfig, *, epochs: int, start_epoch: int, batch_size: int,
    channels_last: bool, compiled: bool,
) -> None:
    """Progressive resizing grows the train crop over the epochs: a batch that fits at the first
    epoch's side can run out of GPU memory at a later one's, hours in. One forward and backward of
    the bare model at the run's largest side from `start_epoch` on, now, makes that one line at
    startup (an OutOfMemory error; every rank stops). The optimizer's state is counted (restored, or
    held as two fp32 copies of the parameters before the first step makes it, Adam's size); DALI's
    own buffers, made once training starts, are not. It leaves no trace: BatchNorm statistics,
    gradients, RNG streams, the train/eval mode and the peak-memory statistic are put back, the
    memory it took is given back. Without progressive resizing the first step is that check. A
    compiled model can fit where its eager self (what this tries) does not: for one, a warning."""
    if not data.progressive.enabled:
        return
    size_at = progressive_size(data)
    sides = [size_at(epoch) for epoch in range(start_epoch, epochs)]
    if not sides or max(sides) <= sides[0]:
        return  # the next step trains at the largest side anyway
    side = max(sides)
    epoch = start_epoch + sides.index(side)
    try:
        ran_out = _runs_out_of_memory(parts, batch_size, side, channels_last)
    except Exception:  # another failure (cuDNN's own allocation, say): the others must not wait for this rank
        all_reduce_max(2.0, parts.dist)
        raise
    outcome = all_reduce_max(float(ran_out), parts.dist)  # a CPU collective: every rank learns of one that ran out
    if outcome == 2.0:
        raise ModelError("data.progressive: the startup check of the largest crop failed on another rank (see its log)")
    if not outcome:
        return
    where = "on some rank's GPU" if parts.dist.enabled else "in the GPU's memory"
    message = (
        f"data.progressive: a training step of model {model_name} at the ramp's largest side, {side}x{side} px "
        f"(epoch {epoch}), with loader.batch_size={batch_size} per GPU does not fit {where}; lower loader.batch_size "
        f"(raise trainer.grad_accum_steps to keep the global batch) or data.progressive.end_size"
    )
    if compiled:
        log.warning("%s (tried on the eager model: the compiled one may fit; if not, epoch %d ends the run)", message, epoch)
        return
    raise OutOfMemory(message)


def _runs_out_of_memory(parts: TrainParts, batch_size: int, side: int, channels_last: bool) -> bool:
    """One forward and backward of the bare model (no DDP hooks, no compiled graph for this shape) on
    a batch of `side` px as the loader gives it, the run's autocast on; whether it ran out of memory.
    Runs on CPU too (the tests), where torch raises no such error."""
    model = unwrap_model(parts.model)
    was_training = model.training
    buffers = [(b, b.detach().clone()) for b in model.buffers()]  # BatchNorm's running stats would learn noise
    # SyncBatchNorm syncs in every training forward: a rank that ran out of memory in the middle
    # would leave the others in an NCCL collective until the timeout. Plain BatchNorm's, here.
    synced = [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)]
    for m in synced:
        m.forward = types.MethodType(_BatchNorm.forward, m)
    cuda = parts.device.type == "cuda"
    ran_out = False
    held = []  # the optimizer's state before the first step makes it: its size (fp32 m and v, as Adam's)
    with torch.random.fork_rng(devices=[parts.device] if cuda else []):  # dropout draws leave the run's streams alone
        try:
            if not parts.optimizer.state:
                held.append(torch.empty(2 * sum(p.numel() for p in model.parameters()), device=parts.device))
            dtype = torch.float16 if parts.amp_dtype is not None else torch.float32  # the loader's (data.build_loaders)
            images = torch.randn(batch_size, 3, side, side, device=parts.device, dtype=dtype)
            if channels_last and cuda:
                images = images.contiguous(memory_format=torch.channels_last)
            model.train()
            with autocast_for(parts):
                logits = model(images)
            logits.float().mean().backward()
        except torch.cuda.OutOfMemoryError:
            ran_out = True  # the flag, not the exception: its traceback would keep the batch's memory
        finally:
            held.clear()
            images = logits = None
            for m in synced:
                del m.forward
            model.train(was_training)
            for p in model.parameters():
                p.grad = None
            with torch.no_grad():
                for live, saved in buffers:
                    live.copy_(saved)
    if cuda:
        torch.cuda.empty_cache()  # the probe's blocks go back to the driver: DALI allocates outside torch's cache
        torch.cuda.reset_peak_memory_stats(parts.device)  # the logged perf/gpu_mem_gib is the training's peak
    return ran_out
