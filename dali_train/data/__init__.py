"""Data loading: one batch contract, four implementations, chosen by `loader=<name>`.

`build_loaders(data, loader, dist, device, ...)` takes the typed `DataConfig` and the loader
option's schema (`dali_train.config`), and picks the implementation by `loader.name`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from dali_train.config import DataConfig, sample_cache_root
from dali_train.data.folder import DatasetError, ImageFolderDataset, Split, scan_dataset, warn_excluded
from dali_train.data.order import padding_per_epoch, steps_per_epoch
from dali_train.data.pil_image import as_rgb  # noqa: F401 - its import lifts PIL's pixel limit for every reader here
from dali_train.data.sample import make_image_folder
from dali_train.data.sniff import find_bad_files
from dali_train.data.transform import Transform
from dali_train.distributed import DistInfo, all_gather_lists, barrier
from dali_train.options import DaliCpuLoaderConfig, LoaderConfig, PytorchLoaderConfig, SyntheticLoaderConfig

log = logging.getLogger(__name__)



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


class NextEpoch:
    """`loader.set_epoch(epoch)` on a thread, started before validation and joined after it: the
    next epoch's pipeline build and first batches (4.6 s over a 1.28M-file list on an H200)
    overlap validation instead of preceding it. Nothing is raised on the thread: `join()` returns
    its exception, and fit.Fit raises it after the validated epoch is saved. Batches come out on
    the thread's current stream: the legacy default stream, as the main thread's (neither sets one)."""

    def __init__(self, loader: Loader, epoch: int, device: torch.device) -> None:
        self.error: BaseException | None = None
        self.waited_s = 0.0  # how long join() blocked: the part of the switch validation did not hide
        self._thread = threading.Thread(target=self._run, args=(loader, epoch, device), name=f"epoch-{epoch}-build")
        self._thread.start()

    def _run(self, loader: Loader, epoch: int, device: torch.device) -> None:
        try:
            if device.type == "cuda":  # the current device is per thread; the batches belong on this rank's
                torch.cuda.set_device(device)
            loader.set_epoch(epoch)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by join()
            self.error = e

    def ready(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> BaseException | None:
        started = time.perf_counter()
        while self._thread.is_alive():  # a build stuck on a hung file system says so instead of hanging mute
            self._thread.join(timeout=120)
            if self._thread.is_alive():
                log.warning("still waiting for %s (the next epoch's pipeline build) after validation", self._thread.name)
        self.waited_s = time.perf_counter() - started
        return self.error


def progressive_size(data: DataConfig) -> Callable[[int], int]:
    """epoch -> train crop side: constant, or FFCV-style linear ramp: start_size up to start_epoch,
    end_size from end_epoch on, in between the nearest multiple of `step` px within [start, end]."""
    p = data.progressive
    if not p.enabled:
        return lambda epoch: data.train_size

    def size_at(epoch: int) -> int:
        if epoch >= p.end_epoch:  # first: with start_epoch == end_epoch, end_size from end_epoch on
            return p.end_size
        if epoch <= p.start_epoch:
            return p.start_size
        size = p.start_size + (epoch - p.start_epoch) / (p.end_epoch - p.start_epoch) * (p.end_size - p.start_size)
        # Ends exact as FFCV's get_resolution, not refused off the step: a fixed train_size may be any size.
        low, high = sorted((p.start_size, p.end_size))  # rounding never leaves them (more memory than budgeted)
        return min(max(math.floor(size / p.step + 0.5) * p.step, low), high)  # halves up, not round()'s to even

    return size_at


def prepare_sample_data(root: str, dist: DistInfo) -> None:
    """data=sample: generate the demo set once, in its own folder (rank 0; the others wait). Under
    this preset (the default) a data.root of the user's is never generated into: a path that is not
    a dataset yet (a typo, an unmounted disk, ImageNet before its val/ is made) is one line naming
    data=imagenet, not a run on made-up images; a dataset there trains with a warning, as the
    preset's demo crops, batch and epochs apply to it."""
    own = sample_cache_root()
    if os.path.realpath(root) != os.path.realpath(own):  # real paths: a symlinked home names one folder two ways
        if not (Path(root) / "val").is_dir():
            raise DatasetError(
                f"data.root={root}: no val/ folder there; the demo set (data=sample, the default preset) is generated "
                f"only in {own}; for a dataset of your own use data=imagenet data.root={root} (or data=imagenette)"
            )
        if dist.is_main:
            log.warning(
                "data.root=%s under data=sample, the demo preset: its small crops, batch and epochs apply; for a "
                "dataset of your own use data=imagenet data.root=%s",
                root,
                root,
            )
        return
    if dist.is_main and not (Path(root) / "val").is_dir():
        log.info("generating the sample dataset in %s (first use only)", root)
        make_image_folder(root)
    barrier(dist)


def _synthetic(data: DataConfig, loader: SyntheticLoaderConfig, dist: DistInfo, **common) -> Loaders:
    from dali_train.data.synthetic import SyntheticLoader

    seed = common.pop("seed")
    common.update(batch_size=loader.batch_size, num_classes=loader.synthetic_num_classes)
    train = SyntheticLoader(steps=loader.synthetic_steps, size=data.train_size, seed=seed + dist.rank, **common)
    val = SyntheticLoader(steps=loader.synthetic_val_steps, size=data.val_size, seed=seed + 1, **common)
    n_val = loader.synthetic_val_steps * loader.batch_size * dist.world_size
    return Loaders(train, val, loader.synthetic_num_classes, n_val, None)


def _pytorch(dataset: ImageFolderDataset, loader: PytorchLoaderConfig, **common) -> tuple[Loader, Loader]:
    from dali_train.data.pytorch import TorchLoader

    extra = dict(
        num_workers=loader.num_workers, pin_memory=loader.pin_memory, persistent_workers=loader.persistent_workers
    )
    return (
        TorchLoader(dataset.train, train=True, **common, **extra),
        TorchLoader(dataset.val, train=False, **common, **extra),
    )


def _dali(dataset: ImageFolderDataset, loader: DaliCpuLoaderConfig, **common) -> tuple[Loader, Loader]:
    from dali_train.data.dali import DaliLoader
    from dali_train.data.dali_graph import Placement

    placement = Placement.choose(loader.name, common["device"])
    if loader.name == "dali" and placement.decoder == "cpu":
        log.warning("loader=dali: no CUDA device, so DALI decodes on CPU threads (as loader=dali_cpu)")
    return (
        DaliLoader(dataset.train, train=True, placement=placement, settings=loader, **common),
        DaliLoader(dataset.val, train=False, placement=placement, settings=loader, **common),
    )


FILE_LOADERS = {"dali": _dali, "dali_cpu": _dali, "pytorch": _pytorch}  # loader.name -> builder; plus synthetic


def split_fingerprint(split: Split) -> str:
    """A digest of a split's files (relative to its folder: per-node copies may sit elsewhere) and labels."""
    cut = len(str(split.root)) + 1  # files are split.root/CLASS/NAME: slicing, not relpath (1.28M files here: 0.4 s, not 4)
    lines = "".join(f"{path[cut:]}\0{label}\n" for path, label in zip(split.files, split.labels, strict=True))
    return hashlib.sha1(lines.encode("utf-8", "surrogateescape")).hexdigest()


def check_ranks_see_one_dataset(dataset: ImageFolderDataset, dist: DistInfo) -> None:
    """Every rank lists data.root itself; each shards the epoch's order and the val split from its
    own list. Per-node copies that differ (an rsync that missed a file) made some images read twice
    and others never, validation included, with no error (or a hang when the step counts differed)."""
    if not dist.enabled or not torch.distributed.is_initialized():  # one process standing in for a rank: no peers
        return
    mine = (len(dataset.train), len(dataset.val), split_fingerprint(dataset.train), split_fingerprint(dataset.val))
    seen = all_gather_lists([mine], dist)
    if len(set(seen)) > 1:
        differ = ", ".join(f"rank {r}: {t} train / {v} val" for r, (t, v, _, _) in enumerate(seen) if seen[r] != seen[0])
        same_counts = len({(t, v) for t, v, _, _ in seen}) == 1
        raise DatasetError(
            f"{dataset.train.root.parent}: the ranks list different files (rank 0: {seen[0][0]} train / "
            f"{seen[0][1]} val; {differ}{'; same counts: file names or classes differ' if same_counts else ''}); "
            f"every rank must see the same dataset (per-node copies must match)"
        )


def build_loaders(
    data: DataConfig,
    loader: LoaderConfig,
    dist: DistInfo,
    device: torch.device,
    *,
    half: bool,
    channels_last: bool,
    seed: int,
) -> Loaders:
    """Train and val loaders of `loader` (its option's schema) over `data`, on `device`.

    half: fp16 images (AMP); channels_last: NHWC on CUDA; seed: the run's base seed."""
    channels_last = device.type == "cuda" and channels_last
    if loader.name == "synthetic":
        return _synthetic(data, loader, dist, device=device, half=half, channels_last=channels_last, seed=seed)
    if loader.name not in FILE_LOADERS:
        raise DatasetError(f"loader.name={loader.name}: unknown; choose one of {', '.join([*FILE_LOADERS, 'synthetic'])}")

    if data.generate_sample:
        prepare_sample_data(data.root, dist)
    dataset = scan_dataset(data.root, exclude_list=data.exclude_list, verify=False)
    if data.verify_files:
        # Each rank checks 1/world of the files; all ranks then drop the union of what was found,
        # exchanged relative to data.root: per-node copies of the data may sit at other paths.
        files = dataset.train.files + dataset.val.files
        root = str(dataset.train.root.parent)
        mine = [(path[len(root) + 1 :], why) for path, why in find_bad_files(files[dist.rank :: dist.world_size])]
        dataset = dataset.without([(os.path.join(root, rel), why) for rel, why in all_gather_lists(mine, dist)])
        warn_excluded(dataset)
    check_ranks_see_one_dataset(dataset, dist)
    if len(dataset.val) < dist.world_size:  # an empty val shard: DALI refuses it, a DataLoader rank waits alone
        raise DatasetError(
            f"{dataset.val.root}: {len(dataset.val)} val files for {dist.world_size} processes; each needs at least one"
        )
    transform = Transform(
        crop_scale=tuple(data.crop_scale),
        crop_ratio=tuple(data.crop_ratio),
        val_resize=data.val_resize,
        val_size=data.val_size,
        mean=tuple(data.mean),
        std=tuple(data.std),
        half=half,
        channels_last=channels_last,
        train_crop=data.train_transform,
        val_resize_whole=data.val_resize_mode == "whole",
    )
    train, val = FILE_LOADERS[loader.name](
        dataset,
        loader,
        batch_size=loader.batch_size,
        dist=dist,
        device=device,
        transform=transform,
        seed=seed,
        train_size_at=progressive_size(data),
    )
    steps = steps_per_epoch(len(dataset.train), loader.batch_size, dist.world_size)
    padding = padding_per_epoch(len(dataset.train), loader.batch_size, dist.world_size)
    log.info(
        "data: %s, %d classes, %d train / %d val files; loader=%s, batch %d per rank × %d ranks = %d global; "
        "%d steps/epoch (%d files repeated to fill the last global batch)",
        data.root,
        dataset.num_classes,
        len(dataset.train),
        len(dataset.val),
        loader.name,
        loader.batch_size,
        dist.world_size,
        loader.batch_size * dist.world_size,
        steps,
        padding,
    )
    return Loaders(train, val, dataset.num_classes, len(dataset.val), dataset)
