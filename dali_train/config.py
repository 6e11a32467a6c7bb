"""Typed configuration schema: one dataclass per option, registered in Hydra's ConfigStore.

`conf/config.yaml` lists `config_schema` (the `Config` below) first in its defaults, and every
option file starts from its own schema (`conf/loader/pytorch.yaml`: `defaults: [pytorch_schema,
_self_]`, Hydra's "schema in the same config group"). So a misspelt key (`loader.batchsize=3`), a
wrong type (`optimizer.lr=abc`) and a key of another option (`loader=pytorch loader.num_threads=3`)
all fail at composition, before any work. Each default lives here and only here; the YAML files in
`conf/` set what differs between options and carry the comments users read.

Values the types cannot check (names, ranges, combinations) are checked in `__post_init__`, which
runs when train.py converts the composed config with `load_config` (`OmegaConf.to_object`): a
UserError naming the key, before any work. The builders receive these typed objects, never the
whole config; this module is the only one of the package that sees it.

The schemas of the option groups (loader, optimizer, scheduler) are in dali_train/options.py;
they are importable from here too. The one-line errors of composition are in config_errors.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dali_train.config_errors import key_line, refuse_keys_past_the_schema, require_values
from dali_train.errors import UserError
from dali_train.options import (  # the option groups' schemas
    AnnealSchedulerConfig,
    DaliCpuLoaderConfig,
    DaliLoaderConfig,
    FlatCosSchedulerConfig,
    LoaderConfig,
    OptimizerConfig,
    PytorchLoaderConfig,
    SchedulerConfig,
    SgdConfig,
    StepSchedulerConfig,
    SyntheticLoaderConfig,
    TimmOptimizerConfig,
    must_be_at_least,
    must_be_in,
    must_be_one_of,
)
from dali_train.run_dirs import hydra_record_dir

AMP_CHOICES = ("bf16", "fp16", "off")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TRAIN_TRANSFORMS = ("random_resized_crop", "resize", "random_square_crop")
VAL_RESIZE_MODES = ("shorter", "whole")
WEIGHT_INITS = ("timm", "fan_in")


# --- data -------------------------------------------------------------------------------------


@dataclass
class ProgressiveConfig:
    enabled: bool = False  # grow the train crop linearly from start_size to end_size
    start_size: int = 160  # train crop side at start_epoch, px
    end_size: int = 192  # train crop side at end_epoch and after, px
    start_epoch: int = 0  # first epoch of the ramp (0-based)
    end_epoch: int = 10  # epoch at which end_size is reached
    step: int = 32  # sizes between the ends are rounded to the nearest multiple of this, as in FFCV

    def __post_init__(self) -> None:
        must_be_at_least("data.progressive.step", self.step, 1)
        must_be_at_least("data.progressive.start_size", self.start_size, self.step)
        must_be_at_least("data.progressive.end_size", self.end_size, self.step)
        must_be_at_least("data.progressive.start_epoch", self.start_epoch, 0)
        must_be_at_least("data.progressive.end_epoch", self.end_epoch, self.start_epoch)
        if not self.enabled:  # as TrainerConfig's: a setting of the ramp most likely meant to turn it on
            unused = [
                f"data.progressive.{f.name}={getattr(self, f.name)}"
                for f in dataclasses.fields(self)
                if f.name != "enabled" and getattr(self, f.name) != f.default
            ]
            if unused:
                logging.getLogger(__name__).warning(
                    "not used, the feature being off: %s (data.progressive.enabled=false)", "; ".join(unused)
                )


@dataclass
class DataConfig:
    name: str = MISSING  # preset name (sample, imagenet, imagenette, ...), for logs only
    root: str = MISSING  # folder with train/<class>/*.JPEG and val/<class>/*.JPEG
    generate_sample: bool = False  # root is data=sample's folder (sample_cache_root): generated there when absent
    train_size: int = 224  # side of the train crop (or squish) fed to the model, px
    val_size: int = 224  # side of the center crop at validation, px
    val_resize: int = 256  # shorter side before the validation center crop, px
    # random_resized_crop | resize (the whole image squished to train_size²) | random_square_crop (the
    # shorter side scaled to train_size, a square at a random place along the longer: fastai's Resize)
    train_transform: str = "random_resized_crop"
    val_resize_mode: str = "shorter"  # shorter: shorter side to val_resize | whole: image squished to val_resize²
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    crop_ratio: list[float] = field(default_factory=lambda: [3 / 4, 4 / 3])  # aspect-ratio range
    mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])  # per channel, 0..1 scale
    std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])  # per channel, 0..1 scale
    verify_files: bool = True  # header/trailer check of every file at startup; bad ones are skipped
    exclude_list: str | None = None  # file of relative paths to skip (written by scan_dataset.py)
    progressive: ProgressiveConfig = field(default_factory=ProgressiveConfig)

    def __post_init__(self) -> None:
        must_be_one_of("data.train_transform", self.train_transform, TRAIN_TRANSFORMS)
        must_be_one_of("data.val_resize_mode", self.val_resize_mode, VAL_RESIZE_MODES)
        for key in ("train_size", "val_size", "val_resize"):
            must_be_at_least(f"data.{key}", getattr(self, key), 1)
        for key, bounds in (("crop_scale", self.crop_scale), ("crop_ratio", self.crop_ratio)):
            if len(bounds) != 2 or not 0 < bounds[0] <= bounds[1]:  # the loaders fail on it at the first batch
                raise UserError(f"data.{key}={list(bounds)}: must be [min, max] with 0 < min <= max")
        if self.crop_scale[1] > 1:  # a share of the image's area: above 1 the crop cannot fit inside the image
            raise UserError(f"data.crop_scale={list(self.crop_scale)}: shares of the image's area, at most 1")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise UserError(f"data.mean={list(self.mean)} data.std={list(self.std)}: 3 values each, std above 0")
        if max(self.mean) > 1 or max(self.std) > 1:  # the loaders scale pixels to 0..1 first: 0-255 stats flatten them
            raise UserError(
                f"data.mean={list(self.mean)} data.std={list(self.std)}: on the 0..1 scale of pixels "
                f"(ImageNet's: [0.485, 0.456, 0.406] and [0.229, 0.224, 0.225]); divide 0-255 values by 255"
            )
        if self.val_resize < self.val_size:  # DALI cannot crop outside the image; torchvision would pad zeros
            raise UserError(f"data.val_resize={self.val_resize}: below data.val_size={self.val_size}; the crop is cut from it")


# --- model ------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    name: str = MISSING  # any timm model name (timm.list_models())
    drop_path_rate: float = 0.0  # stochastic depth, for models that support it
    pretrained: str | None = None  # local checkpoint file to start from; hubs are never used
    kwargs: dict[str, Any] = field(default_factory=dict)  # more timm.create_model arguments (act_layer, block_args...)
    pretrained_strict: bool = True  # false: load the tensors that fit, warn with counts of the rest
    self_attention: bool = False  # fastai xresnet's self-attention layer in layer1's last block (timm ResNets)
    stem_blur_pool: bool = False  # fastai's MaxBlurPool as the stem's pool only (timm's aa_layer blurs every stride)
    blur_strided_convs: bool = False  # FFCV's BlurPool: a 3x3 blur before every strided conv of >= 16 input channels
    weight_init: str = "timm"  # timm (the model's own) | fan_in (fastai's init_cnn for timm ResNets: kaiming normal by fan-in)

    def __post_init__(self) -> None:
        must_be_in("model.drop_path_rate", self.drop_path_rate, 0, 1)
        must_be_one_of("model.weight_init", self.weight_init, WEIGHT_INITS)


# --- trainer ----------------------------------------------------------------------------------


@dataclass
class TrainerConfig:
    epochs: int = 5  # training epochs (the schedule's length)
    epochs_per_job: int | None = None  # stop after this many epochs in one job; resume continues
    device: str = "auto"  # auto | cpu | cuda
    resume: str | None = None  # checkpoint path, or auto = checkpoints/last.pt of this run dir
    eval_only: bool = False  # evaluate the resumed/pretrained model and exit
    amp: str = "bf16"  # bf16 | fp16 | off (always off on CPU)
    channels_last: bool = True  # NHWC memory format on CUDA
    tf32: bool = True  # TF32 tensor cores for fp32 matmuls and convolutions (false: full fp32 where amp=off)
    compile: bool = False  # torch.compile the model (before the DDP wrap)
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs
    cuda_max_connections: int = 32  # CUDA_DEVICE_MAX_CONNECTIONS unless set in the environment; 0 = CUDA's 8; read as CUDA starts
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
    ema_warmup: bool = False  # timm's EMA warmup: decay 1-(1+step)^(-2/3), capped at ema_decay (short runs)
    save_every_n_steps: int = 0  # mid-epoch last.pt every N optimizer updates (N x grad_accum_steps batches); 0 = off
    log_every_n_steps: int = 50  # step interval of logs, TensorBoard points and host syncs
    max_steps_per_epoch: int | None = None  # cap train steps per epoch (smoke tests)
    max_val_steps: int | None = None  # cap val batches (smoke tests; val_samples then partial)
    val_flip_tta: bool = False  # validate on the mean logits of each image and its mirror (FFCV's lr_tta)
    val_every_n_epochs: int = 1  # validate every N-th epoch and the last of a run or of an epochs_per_job job
    max_nonfinite_skips: int = 0  # updates with a NaN/inf loss to skip before stopping; 0 = stop at the first
    dist_timeout_s: int = 1800  # seconds a rank waits in a collective for the others before it stops

    def __post_init__(self) -> None:
        must_be_one_of("trainer.amp", self.amp, AMP_CHOICES)
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:  # below 0 torch reverses the gradients
            raise UserError(f"trainer.clip_grad_norm={self.clip_grad_norm}: must be above 0, or null for no clipping")
        for key in ("max_steps_per_epoch", "max_val_steps", "dist_timeout_s"):
            if getattr(self, key) is not None:
                must_be_at_least(f"trainer.{key}", getattr(self, key), 1)
        for key in ("save_every_n_steps", "max_nonfinite_skips"):
            must_be_at_least(f"trainer.{key}", getattr(self, key), 0)
        must_be_in("trainer.cuda_max_connections", self.cuda_max_connections, 0, 32, high_ok=True)  # CUDA's range
        must_be_one_of("trainer.device", self.device, DEVICE_CHOICES)
        must_be_one_of("trainer.compile_mode", self.compile_mode, COMPILE_MODES)
        for key in ("epochs", "grad_accum_steps", "log_every_n_steps", "val_every_n_epochs"):
            must_be_at_least(f"trainer.{key}", getattr(self, key), 1)
        if self.epochs_per_job is not None:  # 0 would end every job at once, "done", with nothing trained
            must_be_at_least("trainer.epochs_per_job", self.epochs_per_job, 1)
        must_be_in("trainer.label_smoothing", self.label_smoothing, 0, 1)
        must_be_at_least("trainer.mixup_alpha", self.mixup_alpha, 0)
        must_be_at_least("trainer.cutmix_alpha", self.cutmix_alpha, 0)
        must_be_in("trainer.ema_decay", self.ema_decay, 0, 1)
        # A setting of a feature that is off is most likely meant to turn it on; a warning, not an
        # error, so that a sweep over trainer.ema=true,false with one ema_decay still runs.
        unused = [
            f"trainer.{key}={getattr(self, key)} (trainer.{switch}=false)"
            for key, switch in (("compile_mode", "compile"), ("ema_decay", "ema"), ("ema_warmup", "ema"))
            if not getattr(self, switch) and getattr(self, key) != TRAINER_DEFAULTS[key]
        ]
        if unused:
            logging.getLogger(__name__).warning("not used, the feature being off: %s", "; ".join(unused))


TRAINER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainerConfig)}


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Config:
    seed: int = 0  # base seed: model init uses it on every rank; rank/epoch streams derive theirs from it
    data: DataConfig = field(default_factory=DataConfig)
    loader: LoaderConfig = MISSING  # conf/loader/<name>.yaml, on its option's schema
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = MISSING  # conf/optimizer/<name>.yaml, on its option's schema
    scheduler: SchedulerConfig = MISSING  # conf/scheduler/<name>.yaml, on its option's schema
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        """Checks that involve two groups (each group has checked its own keys by now)."""
        must_be_in("seed", self.seed, 0, 2**32)  # numpy's range; ranks and epochs derive theirs from it
        t = self.trainer
        if t.eval_only and not (t.resume or self.model.pretrained):
            raise UserError("trainer.eval_only=true needs trainer.resume=PATH or model.pretrained=PATH")
        if (t.mixup_alpha or t.cutmix_alpha) and self.loader.batch_size % 2:
            raise UserError(f"loader.batch_size={self.loader.batch_size}: Mixup/CutMix needs an even batch size")
        ramp = self.data.progressive
        # a warning, not an error, as for a setting of a feature that is off: a sweep over trainer.epochs still runs
        if ramp.enabled and ramp.end_epoch > t.epochs - 1 and ramp.start_size != ramp.end_size:
            logging.getLogger(__name__).warning(
                "data.progressive.end_epoch=%d: past the last epoch, %d (trainer.epochs=%d): the train crop never "
                "reaches data.progressive.end_size=%d",
                ramp.end_epoch,
                t.epochs - 1,
                t.epochs,
                ramp.end_size,
            )


SCHEMAS: dict[str, dict[str, type]] = {  # group -> schema name (in the option's defaults list) -> dataclass
    "loader": {
        "dali_schema": DaliLoaderConfig,
        "dali_cpu_schema": DaliCpuLoaderConfig,
        "pytorch_schema": PytorchLoaderConfig,
        "synthetic_schema": SyntheticLoaderConfig,
    },
    "optimizer": {"sgd_schema": SgdConfig, "timm_schema": TimmOptimizerConfig},
    "scheduler": {
        "anneal_schema": AnnealSchedulerConfig,
        "flat_cos_schema": FlatCosSchedulerConfig,
        "step_schema": StepSchedulerConfig,
    },
}


SAMPLE_DIR = ".cache/sample-v1"  # data=sample's generated demo set, under the launch directory


def sample_cache_root() -> str:
    """Where data=sample generates and reads its demo set (`${dali_train.sample_root:}`)."""
    return os.path.join(os.getcwd(), SAMPLE_DIR)


def register_configs() -> None:
    """Make `config_schema` and each option's schema available to the defaults lists in conf/, and
    the `${dali_train.sample_root:}` resolver (under the launch directory; unlike `${hydra:runtime.cwd}`
    it also resolves in configs composed outside @hydra.main: tests, scripts/benchmark.py)."""
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            store.store(group=group, name=name, node=node)
    OmegaConf.register_new_resolver("dali_train.sample_root", sample_cache_root, replace=True)
    OmegaConf.register_new_resolver("dali_train.hydra_record_dir", hydra_record_dir, replace=True)


def load_config(cfg: DictConfig) -> Config:
    """The composed config as typed objects, every value checked (`__post_init__`); a UserError
    naming the key otherwise. The builders take the parts of what this returns."""
    refuse_keys_past_the_schema(cfg)
    require_values(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # an interpolation that does not resolve, say
        raise UserError(key_line(e)) from None
