"""What one optimization step needs (engine.TrainParts), built from the typed config sections:
train.py and scripts/benchmark.py assemble the same model, loss, optimizer and schedule."""

from __future__ import annotations

import dataclasses
import logging

import torch
from timm.utils import random_seed, unwrap_model

from dali_train.config import ModelConfig, TrainerConfig
from dali_train.distributed import DistInfo
from dali_train.engine import TrainParts
from dali_train.loss import build_loss
from dali_train.models import build_model, wrap_for_training
from dali_train.optim import build_optimizer, build_scheduler
from dali_train.options import OptimizerConfig, SchedulerConfig

log = logging.getLogger(__name__)


def build_train_parts(
    model_cfg: ModelConfig,
    optimizer_cfg: OptimizerConfig,
    scheduler_cfg: SchedulerConfig,
    trainer: TrainerConfig,
    *,
    seed: int,
    dist: DistInfo,
    device: torch.device,
    num_classes: int,
    updates_per_epoch: int,
    global_batch: int,
    amp_dtype: torch.dtype | None,
    restoring: str | None = None,
) -> TrainParts:
    """Model (wrapped: to device → EMA → compile → DDP), loss, optimizer, schedule and scaler.

    The model is initialized from `seed` on every rank alike (EMA copies it before DDP would
    broadcast rank 0's weights); rank-dependent RNG streams start after it. `restoring`: the
    checkpoint the caller will load into these parts; `model.pretrained` is then not read."""
    if restoring and model_cfg.pretrained:  # a requeued job whose pretrained file is gone still resumes
        log.info("model.pretrained=%s not loaded: the weights of %s replace it", model_cfg.pretrained, restoring)
        model_cfg = dataclasses.replace(model_cfg, pretrained=None)
    random_seed(seed)
    model = build_model(model_cfg, num_classes, evaluate=trainer.eval_only)
    random_seed(seed, rank=1000 * dist.rank)
    model, ema = wrap_for_training(
        model,
        device,
        dist,
        channels_last=trainer.channels_last,
        sync_bn=trainer.sync_bn,
        ema_decay=trainer.ema_decay if trainer.ema else None,
        ema_warmup=trainer.ema_warmup,
        compile=trainer.compile,
        compile_mode=trainer.compile_mode,
    )
    loss_fn, mixup = build_loss(
        label_smoothing=trainer.label_smoothing,
        mixup_alpha=trainer.mixup_alpha,
        cutmix_alpha=trainer.cutmix_alpha,
        num_classes=num_classes,
    )
    # On the bare model: timm matches its no_weight_decay() names, which DDP's and compile's wrappers
    # hide or prefix (module., _orig_mod.), so pos_embed & co. would be decayed under torchrun.
    optimizer = build_optimizer(optimizer_cfg, unwrap_model(model), global_batch=global_batch)
    return TrainParts(
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(scheduler_cfg, optimizer, steps_per_epoch=updates_per_epoch, epochs=trainer.epochs),
        loss_fn=loss_fn,
        device=device,
        dist=dist,
        amp_dtype=amp_dtype,
        scaler=torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None,
        ema=ema,
        mixup=mixup,
        grad_accum_steps=trainer.grad_accum_steps,
        clip_grad_norm=trainer.clip_grad_norm,
    )
