"""Run setup between the config and the loop: option checks, device, precision, seeding, and
wrapping the model for training (to device → channels_last → SyncBN → EMA → compile → DDP)."""

from __future__ import annotations

import logging
import math
import os

import torch
from omegaconf import OmegaConf
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.utils import ModelEmaV3, random_seed

from dali_train.distributed import DistInfo
from dali_train.engine import TrainParts
from dali_train.errors import UserError
from dali_train.models import build_model
from dali_train.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
DEVICES = ("auto", "cpu", "cuda")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def set_cuda_max_connections(connections: int) -> str | None:
    """Set CUDA_DEVICE_MAX_CONNECTIONS unless the user's environment has it; call before CUDA starts.

    DALI's many small copies and kernels otherwise queue behind the model's kernels in CUDA's 8
    hardware work queues (H200: 32 queues lifted ResNet-18 e2e from 77% to 91% of model-only, 1 queue
    dropped it to 3-4k img/s). Returns the value in effect (None: CUDA's default)."""
    if connections > 0 and not os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"):
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") or None


def check_options(cfg) -> None:
    """Option values the schema's types cannot check; raises UserError with the valid choices."""
    from dali_train.data import LOADER_NAMES
    from dali_train.optim import SCHEDULER_NAMES, check_optimizer_name

    choices = {
        "loader.name": (cfg.loader.name, LOADER_NAMES),
        "scheduler.name": (cfg.scheduler.name, SCHEDULER_NAMES),
        "trainer.amp": (cfg.trainer.amp, tuple(AMP_DTYPES)),
        "trainer.device": (cfg.trainer.device, DEVICES),
        "trainer.compile_mode": (cfg.trainer.compile_mode, COMPILE_MODES),
    }
    check_optimizer_name(cfg.optimizer.name)
    for key, (value, valid) in choices.items():
        if value not in valid:
            raise UserError(f"{key}={value}: unknown; choose one of {', '.join(valid)}")
    positive = {
        "loader.batch_size": cfg.loader.batch_size,
        "trainer.grad_accum_steps": cfg.trainer.grad_accum_steps,
        "trainer.epochs": cfg.trainer.epochs,
        "trainer.log_every_n_steps": cfg.trainer.log_every_n_steps,
    }
    for key, value in positive.items():
        if value < 1:
            raise UserError(f"{key}={value}: must be at least 1")
    if cfg.optimizer.lr <= 0:
        raise UserError(f"optimizer.lr={cfg.optimizer.lr}: must be positive")
    for key, value in (
        ("scheduler.min_lr", cfg.scheduler.min_lr),
        ("scheduler.warmup_lr_init", cfg.scheduler.warmup_lr_init),
    ):
        if value < 0:
            raise UserError(f"{key}={value}: must be at least 0")
    if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
        raise UserError("trainer.device=cuda: no CUDA device is visible; use trainer.device=cpu or auto")
    if cfg.trainer.eval_only and not (cfg.trainer.resume or cfg.model.pretrained):
        raise UserError("trainer.eval_only=true needs trainer.resume=PATH or model.pretrained=PATH")
    if (cfg.trainer.mixup_alpha or cfg.trainer.cutmix_alpha) and cfg.loader.batch_size % 2:
        raise UserError(f"loader.batch_size={cfg.loader.batch_size}: Mixup/CutMix needs an even batch size")


def select_device(name: str, dist: DistInfo) -> torch.device:
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", dist.local_rank % torch.cuda.device_count())


def amp_dtype_for(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype; fp32 on CPU, where bf16 autocast is slow on most CPUs."""
    return AMP_DTYPES[name] if device.type == "cuda" else None


def configure_backends(device: torch.device, *, deterministic: bool, cudnn_benchmark: bool) -> None:
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_benchmark and not deterministic
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def prepare_model(
    model: torch.nn.Module,
    device: torch.device,
    dist: DistInfo,
    *,
    channels_last: bool,
    sync_bn: bool,
    ema_decay: float | None,
    compile: bool,
    compile_mode: str = "default",
) -> tuple[torch.nn.Module, ModelEmaV3 | None]:
    """The order matters: EMA copies the model on its device before compile/DDP wrap it (timm's
    rule), and compile comes before DDP so DDP's hooks see the compiled graph's buckets.

    With CUDA graphs (reduce-overhead) torch's cudagraph trees copy each non-static input (a DALI
    batch, whose buffer DALI reuses) into the graph's own buffer, and a step's outputs are consumed
    (loss, backward) before the next forward replays: no `cudagraph_mark_step_begin` or clone is
    needed in the training loop, whose forward/backward pairs mark the steps themselves."""
    model = model.to(device)
    if channels_last and device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if sync_bn and dist.enabled:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ema = ModelEmaV3(model, decay=ema_decay, device=device) if ema_decay else None
    if compile:
        model = torch.compile(model, mode=compile_mode)
    if dist.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return model, ema


def build_loss(label_smoothing: float, mixup_alpha: float, cutmix_alpha: float, num_classes: int):
    """(train loss, mixup or None): soft-target CE when Mixup/CutMix mixes labels (the smoothing
    then goes into the mixed targets), plain CE with label smoothing otherwise."""
    if mixup_alpha or cutmix_alpha:
        mixup = Mixup(
            mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, label_smoothing=label_smoothing, num_classes=num_classes
        )
        return SoftTargetCrossEntropy(), mixup
    return torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing), None


def updates_per_epoch(loader_steps: int, max_steps: int | None, grad_accum_steps: int) -> int:
    """Optimizer steps per epoch as the loop makes them: one every `grad_accum_steps` micro-steps
    and one on the epoch's last (partial) group, so ceil, not floor."""
    steps = loader_steps if max_steps is None else min(loader_steps, max_steps)
    return max(math.ceil(steps / grad_accum_steps), 1)


def build_train_parts(
    cfg, dist: DistInfo, device: torch.device, *, num_classes: int, updates_per_epoch: int
) -> TrainParts:
    """Model, EMA, loss, optimizer, schedule and scaler for `cfg` (the whole run config).

    The model is initialized from `cfg.seed` on every rank alike (EMA copies it before DDP would
    broadcast rank 0's weights); rank-dependent RNG streams start after it.
    """
    tc = cfg.trainer
    random_seed(cfg.seed)
    model = build_model(
        cfg.model.name,
        num_classes,
        drop_path_rate=cfg.model.drop_path_rate,
        pretrained=cfg.model.pretrained,
        kwargs=OmegaConf.to_container(cfg.model.kwargs),
        pretrained_strict=cfg.model.pretrained_strict,
    )
    random_seed(cfg.seed, rank=1000 * dist.rank)
    model, ema = prepare_model(
        model,
        device,
        dist,
        channels_last=tc.channels_last,
        sync_bn=tc.sync_bn,
        ema_decay=tc.ema_decay if tc.ema else None,
        compile=tc.compile,
        compile_mode=tc.compile_mode,
    )
    loss_fn, mixup = build_loss(tc.label_smoothing, tc.mixup_alpha, tc.cutmix_alpha, num_classes)
    global_batch = cfg.loader.batch_size * dist.world_size * tc.grad_accum_steps
    optimizer = build_optimizer(cfg.optimizer, model, global_batch=global_batch)
    scheduler = build_scheduler(cfg.scheduler, optimizer, steps_per_epoch=updates_per_epoch, epochs=tc.epochs)
    amp_dtype = amp_dtype_for(tc.amp, device)
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    return TrainParts(
        model,
        optimizer,
        scheduler,
        loss_fn,
        device,
        dist,
        amp_dtype,
        scaler,
        ema,
        mixup,
        tc.grad_accum_steps,
        tc.clip_grad_norm,
    )
