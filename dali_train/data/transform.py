"""What every loader's images look like after decoding: crop, flip, normalization, dtype, layout.

A module of its own so that the torchvision loader does not import DALI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transform:
    """What the images look like after the pipeline."""

    crop_scale: tuple[float, float]  # random-resized-crop area range (train)
    crop_ratio: tuple[float, float]  # aspect-ratio range (train)
    val_resize: int  # shorter side before the center crop (val)
    val_size: int  # center crop side (val)
    mean: tuple[float, float, float]  # 0..1 scale
    std: tuple[float, float, float]
    half: bool  # fp16 output (AMP); DALI has no bf16 type, autocast converts at the first layer
    channels_last: bool  # HWC output, handed to torch as an NCHW view with channels_last strides
    train_crop: str = "random_resized_crop"  # data.train_transform: random_resized_crop | resize | random_square_crop
    val_resize_whole: bool = False  # val: squish the whole image to val_resize² (else its shorter side) before the crop
