"""DALI pipelines: JPEG decode, random-resized crop, flip and normalize, on the GPU or on CPU threads.

Three placements of the same graph (`Placement`):
- `dali` on a GPU: the "mixed" decoder (nvJPEG, with the hardware JPEG engine taking
  `hw_decoder_load` of the images) fused with the random crop, then resize, flip and normalize on
  the GPU;
- `dali_cpu` on a GPU: decode, crop and resize on CPU threads, normalize on the GPU;
- either one without a GPU (`device_id=None`): everything on CPU threads; the tests run this.

The train pipeline is rebuilt every epoch (`set_epoch`): its file list is that epoch's order
(`order.epoch_order`), its seed derives from (seed, epoch, rank), and its crop side may follow the
progressive-resize schedule. That makes a resumed epoch replay exactly, at the cost of one
pipeline build per epoch (0.6-2.5 s on an H200 over 160k files, 4.6 s over ImageNet's 1.28M),
which train.py runs on a thread during validation (`data.NextEpoch`).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from dali_train.data.folder import EXCLUDE_HINT, DatasetError, Split
from dali_train.data.order import EpochOrder, contiguous_shard, epoch_order, steps_per_epoch
from dali_train.data.transform import Transform
from dali_train.distributed import DistInfo
from dali_train.options import DaliLoaderConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    decoder: str  # "mixed" (nvJPEG on the GPU) or "cpu"
    gpu_post: bool  # resize/flip/normalize on the GPU
    device_id: int | None  # CUDA device of the pipeline; None = CPU-only pipeline

    @staticmethod
    def choose(loader_name: str, device: torch.device) -> Placement:
        if device.type != "cuda":
            return Placement("cpu", False, None)
        return Placement("mixed" if loader_name == "dali" else "cpu", True, device.index or 0)


def _decoder_kwargs(placement: Placement, s: DaliLoaderConfig) -> dict:
    if placement.decoder != "mixed":
        return {}
    kwargs = {
        "hw_decoder_load": s.hw_decoder_load,
        "device_memory_padding": s.device_memory_padding,
        "host_memory_padding": s.host_memory_padding,
    }
    if s.preallocate_width_hint and s.preallocate_height_hint:
        kwargs["preallocate_width_hint"] = s.preallocate_width_hint
        kwargs["preallocate_height_hint"] = s.preallocate_height_hint
    return kwargs


def _normalize(images, t: Transform, *, mirror=None, crop=None):
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT16 if t.half else types.FLOAT,
        output_layout="HWC" if t.channels_last else "CHW",
        crop=crop,
        mean=[m * 255 for m in t.mean],
        std=[s * 255 for s in t.std],
        mirror=mirror,
    )


def _reader_source(split: Split, indices: np.ndarray | None) -> tuple[dict, IO[str] | None]:
    """fn.readers.file's input, in `indices` order (all files if None), and the open list file to
    close once the pipeline is built. The list goes as a file DALI parses in C++ (`file_list`):
    given as Python lists, 1.28M names make `Pipeline.build()`, which holds the GIL, ~4x longer,
    and validation's Python loop stops beside it (docs/benchmarks.md). The file is unlinked from the
    start (read through /proc/self/fd), so nothing is left behind by a crash or a kill. Names with
    a line break cannot be lines, and a temp folder that cannot take the list fails no run: lists."""
    order = range(len(split.files)) if indices is None else indices.tolist()  # Python ints index lists 3x faster
    text = "".join([f"{split.files[i]} {split.labels[i]}\n" for i in order])
    if text.count("\n") == len(order):
        handle = None
        try:
            handle = tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape", prefix="dali-train-")
            handle.write(text)  # the names' bytes as listed
            handle.flush()
            # file_root "": DALI would otherwise resolve the (absolute) names against the list's folder
            return {"file_list": f"/proc/self/fd/{handle.fileno()}", "file_root": ""}, handle
        except OSError as e:
            if handle is not None:
                handle.close()
            log.info("DALI file list: %s; passing the names as lists (slower to build)", e)
    else:
        log.info("a file name in %s has a line break; DALI gets the names as lists (slower to build)", split.root)
    return {"files": [split.files[i] for i in order], "labels": [split.labels[i] for i in order]}, None


@pipeline_def
def _train_pipeline(source, shard_id, num_shards, placement, settings, t, size):
    jpegs, labels = fn.readers.file(
        **source,
        shard_id=shard_id,
        num_shards=num_shards,
        # The epoch's shuffle is already in `files` (order.epoch_order): reproducible from
        # (seed, epoch), which DALI's own shuffles are not across a resume.
        random_shuffle=False,
        pad_last_batch=True,
        name="Reader",
    )
    if t.random_crop:
        images = fn.decoders.image_random_crop(
            jpegs,
            device=placement.decoder,
            output_type=types.RGB,
            random_area=list(t.crop_scale),
            random_aspect_ratio=list(t.crop_ratio),
            num_attempts=10,
            **_decoder_kwargs(placement, settings),
        )
    else:
        images = fn.decoders.image(
            jpegs, device=placement.decoder, output_type=types.RGB, **_decoder_kwargs(placement, settings)
        )
    if placement.gpu_post and placement.decoder == "cpu":
        images = images.gpu()
    images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_TRIANGULAR)
    images = _normalize(images, t, mirror=fn.random.coin_flip(probability=0.5))
    return images, labels.gpu() if placement.gpu_post else labels


@pipeline_def
def _val_pipeline(source, shard_id, num_shards, placement, settings, t):
    jpegs, labels = fn.readers.file(
        **source,
        shard_id=shard_id,
        num_shards=num_shards,
        random_shuffle=False,
        pad_last_batch=True,  # padded duplicates are dropped by LastBatchPolicy.PARTIAL
        stick_to_shard=True,
        name="Reader",
    )
    images = fn.decoders.image(
        jpegs, device=placement.decoder, output_type=types.RGB, **_decoder_kwargs(placement, settings)
    )
    if placement.gpu_post and placement.decoder == "cpu":
        images = images.gpu()
    if t.val_resize_whole:
        images = fn.resize(images, resize_x=t.val_resize, resize_y=t.val_resize, interp_type=types.INTERP_TRIANGULAR)
    else:
        images = fn.resize(images, resize_shorter=t.val_resize, interp_type=types.INTERP_TRIANGULAR)
    images = _normalize(images, t, crop=(t.val_size, t.val_size))
    return images, labels.gpu() if placement.gpu_post else labels


class DaliLoader:
    """Batches `(images, labels)` of one split on this rank's device; see `data.Loader`."""

    def __init__(
        self,
        split: Split,
        *,
        train: bool,
        batch_size: int,
        dist: DistInfo,
        device: torch.device,
        placement: Placement,
        settings: DaliLoaderConfig,
        transform: Transform,
        seed: int,
        train_size_at: Callable[[int], int],
    ) -> None:
        self.split, self.train, self.batch_size = split, train, batch_size
        self.dist, self.device, self.placement = dist, device, placement
        self.settings, self.transform, self.seed = settings, transform, seed
        self.train_size_at = train_size_at  # epoch -> crop side (progressive resizing)
        self.epoch, self.start_step = 0, 0
        self._iterator: DALIGenericIterator | None = None
        self.build_times: list[tuple[float, float]] = []  # (pipeline build s, first batch s) per build

    def __len__(self) -> int:
        if self.train:
            return steps_per_epoch(len(self.split), self.batch_size, self.dist.world_size) - self.start_step
        shard = contiguous_shard(len(self.split), self.dist.rank, self.dist.world_size)
        return -(-len(shard) // self.batch_size)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Build this epoch's train pipeline now, so DALI prefetches before the first step. A
        build takes 0.6-2.5 s on an H200 (`build_times`); train.py calls this for the next epoch
        on a thread while it validates (`data.NextEpoch`), so build and prefetch overlap
        validation. Calling again for the same epoch is free."""
        if self.train and (self._iterator is None or (epoch, start_step) != (self.epoch, self.start_step)):
            self.epoch, self.start_step = epoch, start_step
            self._iterator = None  # free the old pipeline before building the next
            self._iterator = self._build()
        self.epoch, self.start_step = epoch, start_step

    def _pipe_kwargs(self, seed: int) -> dict:
        s, p = self.settings, self.placement
        return dict(
            batch_size=self.batch_size,
            num_threads=s.num_threads,
            device_id=p.device_id,
            seed=seed % (2**31),
            prefetch_queue_depth=s.prefetch_queue_depth,
            exec_dynamic=s.exec_dynamic,
            shard_id=self.dist.rank,
            num_shards=self.dist.world_size,
            placement=p,
            settings=s,
            t=self.transform,
        )

    def _order(self) -> EpochOrder:
        """This epoch's train order (all ranks' blocks), from the resume point on."""
        return epoch_order(
            len(self.split),
            seed=self.seed,
            epoch=self.epoch,
            batch_size=self.batch_size,
            world_size=self.dist.world_size,
            start_step=self.start_step,
        )

    def _build(self) -> DALIGenericIterator:
        started = time.perf_counter()
        source, list_file = _reader_source(self.split, self._order().indices if self.train else None)
        try:
            if self.train:
                seed = self.seed * 1_000_003 + self.epoch * 1009 + self.dist.rank
                pipe = _train_pipeline(source, size=self.train_size_at(self.epoch), **self._pipe_kwargs(seed))
                policy = LastBatchPolicy.DROP  # every shard is an exact number of batches anyway
            else:
                pipe = _val_pipeline(source, **self._pipe_kwargs(self.seed + 7))
                policy = LastBatchPolicy.PARTIAL  # drop the padded duplicates: exact val counts
            pipe.build()  # the reader reads the list file here, once; no image is decoded yet
        except RuntimeError as e:  # not a file's fault: say what DALI says, in one line
            what = "train" if self.train else "val"
            raise DatasetError(f"DALI could not build the {what} pipeline over {self.split.root}: "
                               f"{str(e).strip().splitlines()[0]}") from None  # fmt: skip
        finally:
            if list_file is not None:
                list_file.close()
        try:
            built = time.perf_counter()
            # The iterator runs the pipeline for its first batches before it returns, so a bad
            # file there fails here: in set_epoch, i.e. during the previous epoch's validation.
            iterator = DALIGenericIterator(
                pipe, ["images", "labels"], reader_name="Reader", last_batch_policy=policy, auto_reset=True
            )
        except RuntimeError as e:
            if not _is_pipeline_error(e):
                raise
            raise self._decode_error(0) from None
        self.build_times.append((built - started, time.perf_counter() - built))
        log.debug(
            "%s pipeline: build %.2f s, first batch %.2f s", "train" if self.train else "val", *self.build_times[-1]
        )
        return iterator

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._iterator is None:
            self._iterator = self._build()
        done = 0
        try:
            for batch in self._iterator:
                images, labels = batch[0]["images"], batch[0]["labels"]
                if self.transform.channels_last:
                    images = images.permute(0, 3, 1, 2)  # NHWC storage viewed as NCHW: no copy
                # Labels: int32 [N, 1] from the reader -> int64 [N]; no copy when already on device.
                labels = labels.view(-1).to(self.device, torch.int64, non_blocking=True)
                yield images.to(self.device, non_blocking=True), labels
                done += 1
        except RuntimeError as e:
            if not _is_pipeline_error(e):
                raise
            self._iterator = None  # a pipeline that failed cannot run again
            raise self._decode_error(done) from None
        if self.train:
            self._iterator = None  # free this epoch's pipeline; set_epoch picks the next order

    def _decode_error(self, done: int) -> DatasetError:
        """A one-line error naming the file(s) DALI could not decode, found by decoding (with PIL)
        the files of the batch that failed and of those DALI had prefetched with it."""
        from PIL import Image

        if self.train:
            mine = self._order().rank_block(self.dist.rank, self.dist.world_size)
        else:
            mine = contiguous_shard(len(self.split), self.dist.rank, self.dist.world_size)
        ahead = self.settings.prefetch_queue_depth + 1
        candidates = [self.split.files[i] for i in mine[done * self.batch_size : (done + ahead) * self.batch_size]]
        bad = []
        for path in candidates:
            try:
                with Image.open(path) as im:
                    im.load()
            except Exception:  # noqa: BLE001 - any failure marks the file
                bad.append(path)
        what = (
            ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            if bad
            else (f"a file among {len(candidates)} of {self.split.root}")
        )
        where = f"epoch {self.epoch}, batch {self.start_step + done}" if self.train else f"validation batch {done}"
        return DatasetError(f"DALI could not decode {what} ({where}); {EXCLUDE_HINT}")


def _is_pipeline_error(e: RuntimeError) -> bool:
    """DALI reports an operator failure (a file it cannot read or decode) as a RuntimeError
    "Critical error in pipeline: ..."; other RuntimeErrors are bugs and keep their traceback."""
    return "pipeline" in str(e)
