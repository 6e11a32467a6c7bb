"""The DALI graphs: what each pipeline computes from a split's files (JPEG decode, random-resized
crop, squish or random square crop, flip, normalize), in one of three placements (`Placement`):
- `dali` on a GPU: the "mixed" decoder (nvJPEG, with the hardware JPEG engine taking
  `hw_decoder_load` of the images) fused with the random crop, then resize, flip and normalize on
  the GPU;
- `dali_cpu` on a GPU: decode and crop on CPU threads, then resize, flip and normalize on the GPU;
- either one without a GPU (`device_id=None`): everything on CPU threads; the tests run this.
`data.dali.DaliLoader` builds them per epoch and iterates them.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import IO

import numpy as np
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali import math as dmath

from dali_train.data.folder import Split
from dali_train.data.transform import Transform
from dali_train.options import DaliCpuLoaderConfig, DaliLoaderConfig

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


def _decoder_kwargs(placement: Placement, s: DaliCpuLoaderConfig, *, train: bool = True) -> dict:
    # The pixels as stored, EXIF orientation ignored, as PIL's loader (loader=pytorch) and the
    # torchvision references read them: every loader, and the published baselines, see one image.
    kwargs = {"adjust_orientation": False}
    if placement.decoder != "mixed":
        return kwargs
    assert isinstance(s, DaliLoaderConfig), type(s)  # only loader=dali decodes on the GPU
    kwargs |= {
        "hw_decoder_load": s.hw_decoder_load,
        "device_memory_padding": s.device_memory_padding,
        "host_memory_padding": s.host_memory_padding,
    }
    # The buffer hints only where they were measured to pay (the train pipeline's throughput); the
    # validation pipeline would hold their GPU memory (+3.6 GiB at ImageNet's size) for no measured gain.
    if train and s.preallocate_width_hint and s.preallocate_height_hint:
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


def list_lines(split: Split) -> np.ndarray | None:
    """The split's list-file lines ("name label\n", each name's bytes as listed), made once per
    loader, so that an epoch's list is a gather and a join in C: 0.25-0.4 s for 1.28M names, where
    formatting them every epoch took 0.8 s of Python that holds the GIL beside validation (2-core
    machine). None when a name has a line break: such a name cannot be a line."""
    if any("\n" in name for name in split.files):
        log.info("a file name in %s has a line break; DALI gets the names as lists (slower to build)", split.root)
        return None
    pairs = zip(split.files, split.labels, strict=True)
    return np.array([f"{name} {label}\n".encode("utf-8", "surrogateescape") for name, label in pairs], dtype=object)


def reader_source(split: Split, indices: np.ndarray | None, lines: np.ndarray | None) -> tuple[dict, IO[bytes] | None]:
    """fn.readers.file's input, in `indices` order (all files if None), and the open list file to
    close once the pipeline is built. The list goes as a file DALI parses in C++ (`file_list`), made
    of `lines` (`list_lines`): given as Python lists, 1.28M names make `Pipeline.build()`, which
    holds the GIL, ~4x longer, and validation's Python loop stops beside it (docs/benchmarks.md).
    The file is unlinked from the start (read through /proc/self/fd), so nothing is left behind by a
    crash or a kill. Without lines (a name with a line break), or in a temp folder that cannot take
    the list, no run fails: DALI gets lists."""
    if lines is not None:
        handle = None
        try:
            handle = tempfile.TemporaryFile("w+b", prefix="dali-train-")
            handle.write(b"".join(lines if indices is None else lines[indices]))
            handle.flush()
            # file_root "": DALI would otherwise resolve the (absolute) names against the list's folder
            return {"file_list": f"/proc/self/fd/{handle.fileno()}", "file_root": ""}, handle
        except OSError as e:
            if handle is not None:
                handle.close()
            log.info("DALI file list: %s; passing the names as lists (slower to build)", e)
    order = range(len(split.files)) if indices is None else indices.tolist()  # Python ints index lists 3x faster
    return {"files": [split.files[i] for i in order], "labels": [split.labels[i] for i in order]}, None


@pipeline_def
def train_pipeline(source, shard_id, num_shards, placement, settings, t, size):
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
    if t.train_crop == "random_resized_crop":
        images = fn.decoders.image_random_crop(
            jpegs,
            device=placement.decoder,
            output_type=types.RGB,
            random_area=list(t.crop_scale),
            random_aspect_ratio=list(t.crop_ratio),
            num_attempts=10,
            **_decoder_kwargs(placement, settings),
        )
    elif t.train_crop == "random_square_crop":  # the largest square, decoded alone (a region decode), then resized
        shape = fn.peek_image_shape(jpegs, adjust_orientation=False)  # H, W, C as decoded
        side = fn.cast(dmath.min(shape[0], shape[1]), dtype=types.FLOAT)
        images = fn.decoders.image_crop(
            jpegs,
            device=placement.decoder,
            output_type=types.RGB,
            crop_w=side,
            crop_h=side,
            crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
            crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
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
def val_pipeline(source, shard_id, num_shards, placement, settings, t):
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
        jpegs, device=placement.decoder, output_type=types.RGB, **_decoder_kwargs(placement, settings, train=False)
    )
    if placement.gpu_post and placement.decoder == "cpu":
        images = images.gpu()
    if t.val_resize_whole:
        images = fn.resize(images, resize_x=t.val_resize, resize_y=t.val_resize, interp_type=types.INTERP_TRIANGULAR)
    else:
        images = fn.resize(images, resize_shorter=t.val_resize, interp_type=types.INTERP_TRIANGULAR)
    images = _normalize(images, t, crop=(t.val_size, t.val_size))
    return images, labels.gpu() if placement.gpu_post else labels


def decode_one_pipeline():
    """A built batch-of-one pipeline through DALI's CPU decoder, fed with `feed_input("encoded",
    [bytes as uint8])`: which file DALI cannot decode, one at a time, synchronously (a failed run
    leaves the pipeline unusable: build another)."""

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
    def decode_one():
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        return fn.decoders.image(encoded, device="cpu", output_type=types.RGB, adjust_orientation=False)  # as training

    pipe = decode_one()
    pipe.build()
    return pipe
