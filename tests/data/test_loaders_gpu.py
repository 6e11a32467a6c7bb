"""The GPU side of the batch contract (mixed decoder, fp16, channels_last); skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from dali_train.data import Loaders, NextEpoch, build_loaders
from dali_train.distributed import DistInfo
from tests.data.test_loaders import SMALL, make_cfg

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("name", ["dali", "dali_cpu", "pytorch", "synthetic"])
def test_gpu_batches_are_fp16_channels_last_on_the_device(sample_root, name):
    device = torch.device("cuda", 0)
    extra = {"pytorch": ["loader.num_workers=2"], "synthetic": ["loader.synthetic_steps=2"]}.get(name, [])
    cfg = make_cfg(sample_root, f"loader={name}", *extra, *SMALL)
    ld = build_loaders(cfg.data, cfg.loader, DistInfo(0, 0, 1), device, half=True, channels_last=True, seed=cfg.seed)
    ld.train.set_epoch(0)
    images, labels = next(iter(ld.train))
    assert images.device == device and labels.device == device
    assert images.dtype == torch.float16 and labels.dtype == torch.int64
    assert images.shape == (16, 3, 32, 32) and images.is_contiguous(memory_format=torch.channels_last)
    val_images, _ = next(iter(ld.val))
    assert val_images.shape[1:] == (3, 32, 32) and torch.isfinite(val_images.float()).all()


@pytest.mark.parametrize("transform", ["resize", "random_square_crop"])
def test_the_mixed_decoder_takes_every_train_transform(sample_root, transform):
    """The squish decodes whole images and the square crop decodes a region (decoders.image_crop)
    on nvJPEG: the CPU tests cannot reach either GPU decoder call."""
    device = torch.device("cuda", 0)
    cfg = make_cfg(sample_root, "loader=dali", f"data.train_transform={transform}", *SMALL)
    ld = build_loaders(cfg.data, cfg.loader, DistInfo(0, 0, 1), device, half=True, channels_last=True, seed=cfg.seed)
    ld.train.set_epoch(0)
    images, _ = next(iter(ld.train))
    assert images.shape == (16, 3, 32, 32) and torch.isfinite(images.float()).all()


def test_an_epoch_built_on_a_thread_matches_one_built_in_the_main_thread(sample_root):
    """train.py's NextEpoch builds the next DALI pipeline (mixed decoder) on a thread while the main
    thread runs validation's: the batches are the same as a synchronous build's, on the device."""
    device = torch.device("cuda", torch.cuda.device_count() - 1)  # not the thread's default device 0
    cfg = make_cfg(sample_root, "loader=dali", *SMALL)

    def built() -> Loaders:
        return build_loaders(cfg.data, cfg.loader, DistInfo(0, 0, 1), device, half=True, channels_last=True, seed=cfg.seed)

    threaded, plain = built(), built()
    threaded.train.set_epoch(0)
    next_epoch = NextEpoch(threaded.train, 1, device)
    assert sum(1 for _ in threaded.val) == len(threaded.val)
    assert next_epoch.join() is None and threaded.train.epoch == 1
    plain.train.set_epoch(1)
    for (images, labels), (images_ref, labels_ref) in zip(threaded.train, plain.train, strict=True):
        assert images.device == device and torch.equal(labels, labels_ref)
        torch.testing.assert_close(images, images_ref)
