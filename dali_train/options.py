"""The schemas of the option groups conf/loader, conf/optimizer and conf/scheduler: one dataclass
per option, the keys every option of a group has in its base class (`Config` in dali_train.config
holds them). Also the value checks that these and dali_train.config's own schemas share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from dali_train.errors import UserError

LOOKAHEAD = "lookahead_"  # timm's prefix: any optimizer wrapped in Lookahead (lookahead_radamw is Ranger)


def must_be_one_of(key: str, value: str, valid: tuple[str, ...] | list[str]) -> None:
    if value not in valid:
        raise UserError(f"{key}={value}: unknown; choose one of {', '.join(valid)}")


def must_be_at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise UserError(f"{key}={value}: must be at least {low}")


def must_be_in(key: str, value: float, low: float, high: float, *, high_ok: bool = False) -> None:
    """low <= value < high (or <= high): checked with the config, not at the first step that uses it."""
    if not (low <= value <= high if high_ok else low <= value < high):
        raise UserError(f"{key}={value}: must be in [{low}, {high}{']' if high_ok else ')'}")


def _option_name(group: str, name: str, schema: type, options: dict[str, type]) -> None:
    """`name` must be one of the options that this schema describes (`loader=pytorch
    loader.name=dali` would hand DALI a config without its keys)."""
    valid = [n for n, s in options.items() if s is schema]
    if name not in valid:
        raise UserError(f"{group}.name={name}: not an option of this schema; choose one of {', '.join(valid)} (or {group}=NAME)")


# --- loader: conf/loader/<name>.yaml ------------------------------------------------------------


@dataclass
class LoaderConfig:
    """What every loader has; the option's schema adds its own keys."""

    name: str = MISSING  # dali | dali_cpu | pytorch | synthetic (the file name in conf/loader/)
    batch_size: int = 256  # per process (per GPU); the global batch is this × world size × grad_accum_steps

    def __post_init__(self) -> None:
        _option_name("loader", self.name, type(self), LOADER_SCHEMAS)
        must_be_at_least("loader.batch_size", self.batch_size, 1)


@dataclass
class DaliCpuLoaderConfig(LoaderConfig):
    """loader=dali_cpu: DALI decodes on CPU threads (and what loader=dali has too)."""

    num_threads: int = 8  # host threads per process (file reads, JPEG parsing; dali_cpu: decoding)
    prefetch_queue_depth: int = 2  # batches prepared ahead of the training step
    exec_dynamic: bool = False  # true: DALI's dynamic executor (device syncs per batch: slower, docs/benchmarks.md)

    def __post_init__(self) -> None:
        super().__post_init__()
        must_be_at_least("loader.num_threads", self.num_threads, 1)
        must_be_at_least("loader.prefetch_queue_depth", self.prefetch_queue_depth, 1)


@dataclass
class DaliLoaderConfig(DaliCpuLoaderConfig):
    """loader=dali: nvJPEG and the hardware decoder on the GPU; these keys tune that decoder."""

    hw_decoder_load: float = 1.0  # share of JPEGs sent to the A100/H100/H200 hardware decoder
    preallocate_width_hint: int = 5980  # hardware-decoder buffers sized for ImageNet's largest image, px (0 = DALI's)
    preallocate_height_hint: int = 6430  # as NVIDIA's ResNet-50 example; +2.7% RN18 e2e, +3.6 GiB (docs/benchmarks.md)
    device_memory_padding: int = 211025920  # bytes of headroom per GPU decode buffer
    host_memory_padding: int = 140544512  # bytes of headroom per pinned host decode buffer

    def __post_init__(self) -> None:
        super().__post_init__()
        must_be_in("loader.hw_decoder_load", self.hw_decoder_load, 0, 1, high_ok=True)


@dataclass
class PytorchLoaderConfig(LoaderConfig):
    """loader=pytorch: torchvision transforms in DataLoader worker processes."""

    num_workers: int = 8  # worker processes per rank
    pin_memory: bool = True  # page-locked batches for faster host-to-GPU copies
    persistent_workers: bool = True  # keep workers alive across epochs

    def __post_init__(self) -> None:
        super().__post_init__()
        must_be_at_least("loader.num_workers", self.num_workers, 0)


@dataclass
class SyntheticLoaderConfig(LoaderConfig):
    """loader=synthetic: random batches made once on the device, no files read."""

    synthetic_num_classes: int = 1000  # label range
    synthetic_steps: int = 100  # train batches per epoch
    synthetic_val_steps: int = 10  # val batches per epoch

    def __post_init__(self) -> None:
        super().__post_init__()
        must_be_at_least("loader.synthetic_num_classes", self.synthetic_num_classes, 2)
        must_be_at_least("loader.synthetic_steps", self.synthetic_steps, 1)
        must_be_at_least("loader.synthetic_val_steps", self.synthetic_val_steps, 1)


LOADER_SCHEMAS: dict[str, type[LoaderConfig]] = {
    "dali": DaliLoaderConfig,
    "dali_cpu": DaliCpuLoaderConfig,
    "pytorch": PytorchLoaderConfig,
    "synthetic": SyntheticLoaderConfig,
}


# --- optimizer: conf/optimizer/<name>.yaml ---------------------------------------------------------


@dataclass
class OptimizerConfig:
    """What every optimizer has; the option's schema adds its own keys."""

    name: str = MISSING  # sgd, or any timm optimizer name (adamw, lamb, lookahead_radamw...)
    lr: float = 0.1  # peak LR; with scale_lr it is the LR at global batch 256
    scale_lr: bool = True  # lr × global_batch / 256 (Goyal et al.)
    weight_decay: float = 1.0e-4  # L2 / decoupled decay
    no_wd_norm_bias: bool = True  # no weight decay on norm and bias parameters

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise UserError(f"optimizer.lr={self.lr}: must be positive")
        must_be_at_least("optimizer.weight_decay", self.weight_decay, 0)


@dataclass
class SgdConfig(OptimizerConfig):
    """optimizer=sgd: heavy-ball or Nesterov momentum."""

    name: str = "sgd"  # the only name of this schema
    momentum: float = 0.9  # momentum factor
    nesterov: bool = False  # Nesterov momentum instead of heavy-ball (the torchvision reference)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.name != "sgd":
            raise UserError(f"optimizer.name={self.name}: optimizer=sgd is SGD; other optimizers: optimizer=adamw optimizer.name={self.name}")
        must_be_in("optimizer.momentum", self.momentum, 0, 1)


@dataclass
class TimmOptimizerConfig(OptimizerConfig):
    """optimizer=adamw / lamb / ranger, or any timm optimizer by `name`."""

    betas: list[float] | None = None  # for optimizers with betas (others ignore it); null = the optimizer's own
    eps: float | None = None  # for optimizers with an eps term; null = the optimizer's own
    kwargs: dict[str, Any] = field(default_factory=dict)  # more arguments of the timm optimizer (rmsprop: momentum...)

    def __post_init__(self) -> None:
        super().__post_init__()
        from timm.optim import list_optimizers

        if self.name == "sgd":
            raise UserError("optimizer.name=sgd: use optimizer=sgd (its momentum and nesterov keys)")
        base = self.name.removeprefix(LOOKAHEAD)
        if base not in list_optimizers():
            close = [n for n in list_optimizers() if base[:4] and base[:4] in n][:6]
            raise UserError(
                f"optimizer.name={self.name}: not a timm optimizer (similar: {', '.join(close) or 'none'}; "
                "all: timm.optim.list_optimizers(), any of them with the lookahead_ prefix)"
            )
        if self.betas is not None:
            from timm.optim import get_optimizer_info

            info = get_optimizer_info(base)  # one without betas ignores them (ranger.yaml's, with another name)
            if info.has_betas and len(self.betas) != info.num_betas:
                raise UserError(
                    f"optimizer.betas={list(self.betas)}: {self.name} takes {info.num_betas} "
                    "(or optimizer.betas=null for its own)"
                )
            for beta in self.betas:
                must_be_in("optimizer.betas", beta, 0, 1)
        if self.eps is not None:
            must_be_at_least("optimizer.eps", self.eps, 0)


# --- scheduler: conf/scheduler/<name>.yaml ---------------------------------------------------------


@dataclass
class SchedulerConfig:
    """What every schedule has: a linear warmup; the option's schema adds its own keys."""

    name: str = MISSING  # cosine | flat_cos | step | linear (the file name in conf/scheduler/)
    warmup_epochs: float = 0.0  # linear warmup length, epochs (fractions allowed)
    warmup_lr_init: float = 1.0e-5  # LR at step 0 of the warmup

    def __post_init__(self) -> None:
        _option_name("scheduler", self.name, type(self), SCHEDULER_SCHEMAS)
        must_be_at_least("scheduler.warmup_epochs", self.warmup_epochs, 0)
        must_be_at_least("scheduler.warmup_lr_init", self.warmup_lr_init, 0)


@dataclass
class AnnealSchedulerConfig(SchedulerConfig):
    """scheduler=cosine and scheduler=linear: from the peak down to min_lr at the end of the run."""

    min_lr: float = 0.0  # LR at the end (the step after the last update, as timm's schedules end)

    def __post_init__(self) -> None:
        super().__post_init__()
        must_be_at_least("scheduler.min_lr", self.min_lr, 0)


@dataclass
class FlatCosSchedulerConfig(AnnealSchedulerConfig):
    """scheduler=flat_cos: the peak held flat, then a cosine anneal (fastai's fit_flat_cos)."""

    flat_frac: float = 0.75  # share of the post-warmup steps at the peak LR before the anneal

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.flat_frac < 1:
            raise UserError(f"scheduler.flat_frac={self.flat_frac}: must be in [0, 1)")


@dataclass
class StepSchedulerConfig(SchedulerConfig):
    """scheduler=step: the LR multiplied by decay_rate every decay_epochs."""

    decay_epochs: float = 30.0  # epochs between LR drops
    decay_rate: float = 0.1  # LR multiplier at each drop

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decay_epochs <= 0:
            raise UserError(f"scheduler.decay_epochs={self.decay_epochs}: must be positive")
        must_be_in("scheduler.decay_rate", self.decay_rate, 0, 1, high_ok=True)


SCHEDULER_SCHEMAS: dict[str, type[SchedulerConfig]] = {
    "cosine": AnnealSchedulerConfig,
    "linear": AnnealSchedulerConfig,
    "flat_cos": FlatCosSchedulerConfig,
    "step": StepSchedulerConfig,
}
