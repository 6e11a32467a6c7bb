"""Data loading: one batch contract, four implementations, chosen by `loader=<name>`.

`build_loaders(cfg, dist, device, half=...)` is the only function here that reads the config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from dali_train.data.folder import DatasetError, ImageFolderDataset, find_bad_files, scan_dataset, warn_excluded
from dali_train.data.order import padding_per_epoch, steps_per_epoch
from dali_train.data.sample import make_image_folder
from dali_train.distributed import DistInfo, all_gather_lists, barrier

log = logging.getLogger(__name__)

LOADER_NAMES = ("dali", "dali_cpu", "pytorch", "synthetic")
TRAIN_TRANSFORMS = ("random_resized_crop", "resize")
VAL_RESIZE_MODES = ("shorter", "whole")


class Loader(Protocol):
    """What the engine iterates: `(images, labels)` on this rank's device, normalized; images
    float16 (AMP) or float32, channels_last on CUDA; labels int64. `len()` = batches this epoch
    on this rank, the same on every rank for train; `set_epoch` picks the epoch's order and crop."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def set_epoch(self, epoch: int, start_step: int = 0) -> None: ...


@dataclass
class Loaders:
    train: Loader
    val: Loader
    num_classes: int
    num_val_files: int
    dataset: ImageFolderDataset | None  # None for the synthetic loader


def progressive_size(cfg_data) -> Callable[[int], int]:
    """epoch -> train crop side: constant, or FFCV-style linear ramp rounded to `step` px."""
    p = cfg_data.progressive
    if not p.enabled:
        return lambda epoch: cfg_data.train_size

    def size_at(epoch: int) -> int:
        frac = min(max((epoch - p.start_epoch) / max(p.end_epoch - p.start_epoch, 1), 0.0), 1.0)
        size = p.start_size + frac * (p.end_size - p.start_size)
        return max(p.step, round(size / p.step) * p.step)

    return size_at


def prepare_sample_data(root: str, dist: DistInfo) -> None:
    """Generate the built-in sample dataset once (rank 0; the others wait)."""
    if dist.is_main and not (Path(root) / "val").is_dir():
        log.info("generating the sample dataset in %s (first use only)", root)
        make_image_folder(root)
    barrier(dist)


def build_loaders(cfg, dist: DistInfo, device: torch.device, *, half: bool) -> Loaders:
    """Train and val loaders for `cfg.loader.name` on `device` (cfg: the whole run config)."""
    from dali_train.data.dali import DaliLoader, DaliSettings, Placement
    from dali_train.data.pytorch import TorchLoader
    from dali_train.data.synthetic import SyntheticLoader
    from dali_train.data.transform import Transform

    data, lc = cfg.data, cfg.loader
    if lc.name not in LOADER_NAMES:
        raise DatasetError(f"loader.name={lc.name}: unknown; choose one of {', '.join(LOADER_NAMES)}")
    for key, value, valid in (
        ("data.train_transform", data.train_transform, TRAIN_TRANSFORMS),
        ("data.val_resize_mode", data.val_resize_mode, VAL_RESIZE_MODES),
    ):
        if value not in valid:
            raise DatasetError(f"{key}={value}: unknown; choose one of {', '.join(valid)}")
    channels_last = device.type == "cuda" and cfg.trainer.channels_last
    if lc.name == "synthetic":
        common = dict(
            batch_size=lc.batch_size,
            num_classes=lc.synthetic_num_classes,
            device=device,
            half=half,
            channels_last=channels_last,
        )
        train = SyntheticLoader(steps=lc.synthetic_steps, size=data.train_size, seed=cfg.seed + dist.rank, **common)
        val = SyntheticLoader(steps=lc.synthetic_val_steps, size=data.val_size, seed=cfg.seed + 1, **common)
        n_val = lc.synthetic_val_steps * lc.batch_size * dist.world_size
        return Loaders(train, val, lc.synthetic_num_classes, n_val, None)

    if data.generate_sample:
        prepare_sample_data(data.root, dist)
    dataset = scan_dataset(data.root, exclude_list=data.exclude_list, verify=False)
    if data.verify_files:
        # Each rank checks 1/world of the files; all ranks then drop the union of what was found.
        files = dataset.train.files + dataset.val.files
        dataset = dataset.without(all_gather_lists(find_bad_files(files[dist.rank :: dist.world_size]), dist))
        warn_excluded(dataset)
    transform = Transform(
        crop_scale=tuple(data.crop_scale),
        crop_ratio=tuple(data.crop_ratio),
        val_resize=data.val_resize,
        val_size=data.val_size,
        mean=tuple(data.mean),
        std=tuple(data.std),
        half=half,
        channels_last=channels_last,
        random_crop=data.train_transform == "random_resized_crop",
        val_resize_whole=data.val_resize_mode == "whole",
    )
    common = dict(
        batch_size=lc.batch_size,
        dist=dist,
        device=device,
        transform=transform,
        seed=cfg.seed,
        train_size_at=progressive_size(data),
    )
    if lc.name == "pytorch":
        extra = dict(num_workers=lc.num_workers, pin_memory=lc.pin_memory, persistent_workers=lc.persistent_workers)
        train = TorchLoader(dataset.train, train=True, **common, **extra)
        val = TorchLoader(dataset.val, train=False, **common, **extra)
    else:
        placement = Placement.choose(lc.name, device)
        if lc.name == "dali" and placement.decoder == "cpu":
            log.warning("loader=dali: no CUDA device, so DALI decodes on CPU threads (as loader=dali_cpu)")
        settings = DaliSettings(
            num_threads=lc.num_threads,
            prefetch_queue_depth=lc.prefetch_queue_depth,
            hw_decoder_load=lc.hw_decoder_load,
            preallocate_width_hint=lc.preallocate_width_hint,
            preallocate_height_hint=lc.preallocate_height_hint,
            device_memory_padding=lc.device_memory_padding,
            host_memory_padding=lc.host_memory_padding,
            exec_dynamic=lc.exec_dynamic,
        )
        train = DaliLoader(dataset.train, train=True, placement=placement, settings=settings, **common)
        val = DaliLoader(dataset.val, train=False, placement=placement, settings=settings, **common)
    steps = steps_per_epoch(len(dataset.train), lc.batch_size, dist.world_size)
    padding = padding_per_epoch(len(dataset.train), lc.batch_size, dist.world_size)
    log.info(
        "data: %s, %d classes, %d train / %d val files; loader=%s, batch %d per rank × %d ranks = %d global; "
        "%d steps/epoch (%d files repeated to fill the last global batch)",
        data.root,
        dataset.num_classes,
        len(dataset.train),
        len(dataset.val),
        lc.name,
        lc.batch_size,
        dist.world_size,
        lc.batch_size * dist.world_size,
        steps,
        padding,
    )
    return Loaders(train, val, dataset.num_classes, len(dataset.val), dataset)
