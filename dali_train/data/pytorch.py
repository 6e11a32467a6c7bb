"""The torchvision baseline: PIL decode and transforms in DataLoader worker processes.

Same file list, class indices, epoch order and normalization as the DALI loaders (the shards come
from `order.epoch_order`, as for DALI, instead of `DistributedSampler`, so that both loaders pad,
reshuffle and resume identically); same augmentation semantics: RandomResizedCrop(scale, ratio)
(or the whole image squished to the train size, or the shorter side scaled to it and a random
square crop) and a horizontal flip for train; for val, resize
of the shorter side (or the whole image, squished) then center crop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from dali_train.data.folder import EXCLUDE_HINT, DatasetError, Split
from dali_train.data.order import contiguous_shard, epoch_order, steps_per_epoch
from dali_train.data.pil_image import load_rgb
from dali_train.data.transform import Transform
from dali_train.distributed import DistInfo


class FileListDataset(Dataset):
    """ImageFolder over an already scanned file list (ImageFolder would list the folder again and
    derive val's class indices from val's own folders)."""

    def __init__(self, split: Split, transform: Callable) -> None:
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.split.files[i]
        try:
            image = load_rgb(path)
        # what PIL raises for unreadable/undecodable files, and for sizes past its decompression-bomb limit
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            raise DatasetError(f"could not decode {path}: {e}") from None
        return self.transform(image), self.split.labels[i]


def train_transform(size: int, t: Transform) -> Callable:
    if t.train_crop == "random_resized_crop":
        crop = T.RandomResizedCrop(size, scale=t.crop_scale, ratio=t.crop_ratio, antialias=True)
    elif t.train_crop == "random_square_crop":
        crop = T.Compose([T.Resize(size, antialias=True), T.RandomCrop(size)])
    else:
        crop = T.Resize((size, size), interpolation=T.InterpolationMode.BILINEAR, antialias=True)
    return T.Compose(
        [
            crop,
            T.RandomHorizontalFlip(),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float32),
            T.Normalize(t.mean, t.std),
        ]
    )


class ValResizeCrop:
    """Resize (shorter side, or the whole image squished) then center crop, with DALI's rounding:
    the long side and a half-pixel crop offset round half up (torchvision's Resize truncates the long
    side and CenterCrop rounds half to even: a 1-pixel shift on most 500×375 ImageNet images)."""

    def __init__(self, t: Transform) -> None:
        self.resize, self.size, self.whole = t.val_resize, t.val_size, t.val_resize_whole

    def __call__(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        if self.whole:
            w, h = self.resize, self.resize
        elif w < h:
            w, h = self.resize, math.floor(h * self.resize / w + 0.5)
        else:
            w, h = math.floor(w * self.resize / h + 0.5), self.resize
        image = TF.resize(image, [h, w], interpolation=T.InterpolationMode.BILINEAR, antialias=True)
        top, left = math.floor((h - self.size) / 2 + 0.5), math.floor((w - self.size) / 2 + 0.5)
        return TF.crop(image, top, left, self.size, self.size)


def val_transform(t: Transform) -> Callable:
    return T.Compose(
        [
            ValResizeCrop(t),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float32),
            T.Normalize(t.mean, t.std),
        ]
    )


class TorchLoader:
    """Batches `(images, labels)` of one split on this rank's device; see `data.Loader`."""

    def __init__(
        self,
        split: Split,
        *,
        train: bool,
        batch_size: int,
        dist: DistInfo,
        device: torch.device,
        transform: Transform,
        seed: int,
        train_size_at: Callable[[int], int],
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
    ) -> None:
        self.split, self.train, self.batch_size, self.dist = split, train, batch_size, dist
        self.device, self.transform, self.seed, self.train_size_at = device, transform, seed, train_size_at
        self.loader_kwargs = dict(
            num_workers=num_workers,
            pin_memory=pin_memory and device.type == "cuda",
            persistent_workers=persistent_workers and num_workers > 0,
            prefetch_factor=4 if num_workers > 0 else None,
        )
        self.epoch, self.start_step = 0, 0
        self._loader = None

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        if self.train:
            return steps_per_epoch(len(self.split), self.batch_size, self.dist.world_size) - self.start_step
        return -(-len(self._val_indices()) // self.batch_size)

    def _val_indices(self) -> range:
        return contiguous_shard(len(self.split), self.dist.rank, self.dist.world_size)  # as DALI's reader

    def _dataset(self) -> FileListDataset:
        if self.train:
            return FileListDataset(self.split, train_transform(self.train_size_at(self.epoch), self.transform))
        return FileListDataset(self.split, val_transform(self.transform))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.train:
            order = epoch_order(
                len(self.split),
                seed=self.seed,
                epoch=self.epoch,
                batch_size=self.batch_size,
                world_size=self.dist.world_size,
                start_step=self.start_step,
            )
            indices = order.rank_block(self.dist.rank, self.dist.world_size).tolist()
            # The order (sampler) and crop size change per epoch, so the train DataLoader is made
            # per epoch; persistent workers would live one epoch only, so they serve val alone.
            kwargs = dict(self.loader_kwargs, persistent_workers=False)
            torch_generator = torch.Generator().manual_seed(self.seed * 1009 + self.epoch * 31 + self.dist.rank)
            loader = DataLoader(
                self._dataset(),
                batch_size=self.batch_size,
                sampler=indices,
                drop_last=True,
                generator=torch_generator,
                **kwargs,
            )
        else:
            if self._loader is None:
                self._loader = DataLoader(
                    self._dataset(),
                    batch_size=self.batch_size,
                    sampler=list(self._val_indices()),
                    **self.loader_kwargs,
                )
            loader = self._loader
        memory_format = torch.channels_last if self.transform.channels_last else torch.contiguous_format
        dtype = torch.float16 if self.transform.half else torch.float32
        done = 0
        try:
            for images, labels in loader:
                images = images.to(self.device, non_blocking=True).to(dtype=dtype, memory_format=memory_format)
                yield images, labels.to(self.device, non_blocking=True)
                done += 1
        except DatasetError as e:
            # From a worker, DataLoader re-raises it with the worker's traceback in the text; its
            # last line is "...DatasetError: <our one line>". Batches arrive in order: `done` is the bad one.
            message = str(e).strip().splitlines()[-1].split("DatasetError: ", 1)[-1]
            # torch re-raises it from a frame that its traceback holds: a cycle keeping the DataLoader
            # iterator until gc, whose shutdown then waits 5 s for the workers. Without it they stop now.
            e.__traceback__ = None
            where = f"epoch {self.epoch}, batch {self.start_step + done}" if self.train else f"validation batch {done}"
            raise DatasetError(f"{message} ({where}); {EXCLUDE_HINT}") from None
