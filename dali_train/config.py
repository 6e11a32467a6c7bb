"""Typed configuration schema, registered in Hydra's ConfigStore.

`conf/config.yaml` lists `config_schema` first in its defaults, so every YAML file and every
command-line override is merged onto these dataclasses: a misspelt key (`loader.batchsize=3`) or a
wrong type (`optimizer.lr=abc`) fails at composition, before any work. Each default lives here
and only here; the YAML files in `conf/` choose between options and carry the comments users read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


@dataclass
class ProgressiveConfig:
    enabled: bool = False  # grow the train crop linearly from start_size to end_size
    start_size: int = 160  # train crop side at start_epoch, px
    end_size: int = 192  # train crop side at end_epoch and after, px
    start_epoch: int = 0  # first epoch of the ramp (0-based)
    end_epoch: int = 10  # epoch at which end_size is reached
    step: int = 32  # sizes are rounded to the nearest multiple of this, as in FFCV


@dataclass
class DataConfig:
    name: str = MISSING  # preset name (sample, imagenet, imagenette, ...), for logs only
    root: str = MISSING  # folder with train/<class>/*.JPEG and val/<class>/*.JPEG
    generate_sample: bool = False  # create the built-in sample dataset at root if it is absent
    train_size: int = 224  # side of the random-resized crop fed to the model, px
    val_size: int = 224  # side of the center crop at validation, px
    val_resize: int = 256  # shorter side before the validation center crop, px
    train_transform: str = "random_resized_crop"  # random_resized_crop | resize (whole image squished to train_size²)
    val_resize_mode: str = "shorter"  # shorter: shorter side to val_resize | whole: image squished to val_resize²
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    crop_ratio: list[float] = field(default_factory=lambda: [3 / 4, 4 / 3])  # aspect-ratio range
    mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])  # per channel, 0..1 scale
    std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])  # per channel, 0..1 scale
    verify_files: bool = True  # header/trailer check of every file at startup; bad ones are skipped
    exclude_list: str | None = None  # file of relative paths to skip (written by scan_dataset.py)
    progressive: ProgressiveConfig = field(default_factory=ProgressiveConfig)


@dataclass
class LoaderConfig:
    name: str = MISSING  # dali | dali_cpu | pytorch | synthetic
    batch_size: int = 256  # per process (per GPU); the global batch is this × world size
    num_threads: int = 4  # DALI CPU worker threads per process
    prefetch_queue_depth: int = 2  # DALI batches prepared ahead of the training step
    hw_decoder_load: float = 0.65  # share of JPEGs sent to the hardware decoder (A100/H100/H200)
    preallocate_width_hint: int = 0  # DALI decoder buffer hint, px (0 = DALI default)
    preallocate_height_hint: int = 0  # DALI decoder buffer hint, px (0 = DALI default)
    device_memory_padding: int = 211025920  # bytes of headroom per GPU decode buffer
    host_memory_padding: int = 140544512  # bytes of headroom per pinned host decode buffer
    exec_dynamic: bool = True  # DALI's dynamic executor (batches shared zero-copy); false = legacy, copies
    num_workers: int = 8  # pytorch loader: worker processes per rank
    pin_memory: bool = True  # pytorch loader: page-locked batches for faster host-to-GPU copy
    persistent_workers: bool = True  # pytorch loader: keep workers alive across epochs
    synthetic_num_classes: int = 1000  # synthetic loader: label range
    synthetic_steps: int = 100  # synthetic loader: train batches per epoch
    synthetic_val_steps: int = 10  # synthetic loader: val batches per epoch


@dataclass
class ModelConfig:
    name: str = MISSING  # any timm model name (timm.list_models())
    drop_path_rate: float = 0.0  # stochastic depth, for models that support it
    pretrained: str | None = None  # local checkpoint file to start from; hubs are never used
    kwargs: dict[str, Any] = field(default_factory=dict)  # more timm.create_model arguments (act_layer, block_args...)
    pretrained_strict: bool = True  # false: load the tensors that fit, warn with counts of the rest


@dataclass
class OptimizerConfig:
    name: str = MISSING  # sgd (heavy-ball/Nesterov) or any timm optimizer name (adamw, lamb, lookahead_radamw...)
    lr: float = 0.1  # peak LR; with scale_lr it is the LR at global batch 256
    scale_lr: bool = True  # lr × global_batch / 256 (Goyal et al.)
    weight_decay: float = 1.0e-4  # L2 / decoupled decay
    no_wd_norm_bias: bool = True  # no weight decay on norm and bias parameters
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # optimizers with betas (adam family, lamb)
    eps: float = 1.0e-8  # optimizers with an eps term


@dataclass
class SchedulerConfig:
    name: str = MISSING  # cosine | flat_cos | step | linear
    warmup_epochs: float = 0.0  # linear warmup length, epochs (fractions allowed)
    warmup_lr_init: float = 0.0  # LR at step 0 of the warmup
    min_lr: float = 0.0  # LR at the end of the decay (cosine, flat_cos, linear)
    flat_frac: float = 0.75  # flat_cos only: share of the post-warmup steps at the peak LR before the cosine anneal
    decay_epochs: float = 30.0  # step only: epochs between LR drops
    decay_rate: float = 0.1  # step only: LR multiplier at each drop


@dataclass
class TrainerConfig:
    epochs: int = 5  # training epochs (the schedule's length)
    epochs_per_job: int | None = None  # stop after this many epochs in one job; resume continues
    device: str = "auto"  # auto | cpu | cuda
    resume: str | None = None  # checkpoint path, or auto = checkpoints/last.pt of this run dir
    eval_only: bool = False  # evaluate the resumed/pretrained model and exit
    amp: str = "bf16"  # bf16 | fp16 | off (always off on CPU)
    channels_last: bool = True  # NHWC memory format on CUDA
    compile: bool = False  # torch.compile the model (before the DDP wrap)
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs
    cuda_max_connections: int = 32  # CUDA_DEVICE_MAX_CONNECTIONS unless set in the environment; 0 = CUDA's 8
    cudnn_benchmark: bool = True  # autotune convolutions for fixed input sizes
    deterministic: bool = False  # deterministic algorithms (slower); used by the resume test
    grad_accum_steps: int = 1  # micro-batches per optimizer step (no all-reduce between)
    clip_grad_norm: float | None = None  # max global grad norm; null = no clipping
    sync_bn: bool = False  # convert BatchNorm to SyncBatchNorm under DDP
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    mixup_alpha: float = 0.0  # timm Mixup; 0 = off
    cutmix_alpha: float = 0.0  # timm CutMix; 0 = off
    ema: bool = False  # keep a timm ModelEmaV3 copy, evaluated and checkpointed
    ema_decay: float = 0.9998  # per optimizer step
    save_every_n_steps: int = 0  # mid-epoch last.pt every N steps; 0 = end of epoch only
    log_every_n_steps: int = 50  # step interval of logs, TensorBoard points and host syncs
    max_steps_per_epoch: int | None = None  # cap train steps per epoch (smoke tests)
    max_val_steps: int | None = None  # cap val batches (smoke tests; val_samples then partial)
    max_nonfinite_skips: int = 0  # updates with a NaN/inf loss to skip before stopping; 0 = stop at the first
    dist_timeout_s: int = 1800  # seconds a rank waits in a collective for the others before it stops


@dataclass
class Config:
    seed: int = 0  # base seed; ranks and epochs derive theirs from it
    data: DataConfig = field(default_factory=DataConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


def register_configs() -> None:
    """Make `config_schema` available to the defaults list of conf/config.yaml, and the
    `${dali_train.cwd:}` resolver (the launch directory; unlike `${hydra:runtime.cwd}` it also
    resolves in configs composed outside @hydra.main: tests, scripts/benchmark.py)."""
    ConfigStore.instance().store(name="config_schema", node=Config)
    OmegaConf.register_new_resolver("dali_train.cwd", os.getcwd, replace=True)
