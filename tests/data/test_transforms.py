"""Train/val transforms mean the same in every loader: squish-resize or random square train crops,
whole-image val resize."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tests.data.test_loaders import loaders, workers

STRETCH = ["data.train_size=32", "data.val_size=32", "loader.batch_size=4", "data.train_transform=resize"]


@pytest.fixture(scope="module")
def wide_root(tmp_path_factory):
    """2 classes × 4 JPEGs of 96×48 px: a left-to-right gradient, so squishing and cropping differ."""
    root = tmp_path_factory.mktemp("wide")
    ramp = torch.linspace(0, 255, 96).to(torch.uint8).expand(48, 96)
    for split in ("train", "val"):
        for c in range(2):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(4):
                rgb = torch.stack([ramp, ramp.flip(1), torch.full_like(ramp, 60 * c + 10 * i)], dim=-1)
                Image.fromarray(rgb.numpy()).save(root / split / f"c{c}" / f"{i}.JPEG", quality=95)
    return root


def first_val_batch(root, *overrides):
    return next(iter(loaders(root, *overrides).val))[0]


def test_exif_orientation_is_ignored_by_every_loader(tmp_path):
    """A JPEG tagged "rotate 90°" (EXIF orientation 6): DALI's decoders would turn it, PIL's loader
    does not; both loaders must read the stored pixels (as the torchvision references do)."""
    ramp = torch.linspace(0, 255, 96).to(torch.uint8).expand(48, 96)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to display
    for split in ("train", "val"):
        for c in range(2):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            for i in range(2):
                rgb = torch.stack([ramp, torch.full_like(ramp, 100), torch.full_like(ramp, 60 * c + 10 * i)], dim=-1)
                Image.fromarray(rgb.numpy()).save(tmp_path / split / f"c{c}" / f"{i}.JPEG", quality=95, exif=exif)
    common = [*STRETCH, "data.val_resize_mode=whole", "data.val_resize=32"]
    a = first_val_batch(tmp_path, "loader=dali_cpu", *common)
    b = first_val_batch(tmp_path, "loader=pytorch", "loader.num_workers=0", *common)
    assert (a - b).abs().mean().item() < 0.05
    assert (a[:, 0, :, -1] - a[:, 0, :, 0]).mean() > 2  # red still rises left to right: not turned


def test_16_bit_grayscale_reads_the_same_in_every_loader(tmp_path):
    """A 16-bit grayscale PNG (a gradient over the 16-bit range): DALI scales it to 8 bits, PIL's
    convert("RGB") clipped it at 255, so loader=pytorch saw it almost white."""
    ramp = torch.linspace(0, 65535, 96).to(torch.int32).expand(48, 96).contiguous()
    for split in ("train", "val"):
        for c in range(2):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            for i in range(2):
                Image.fromarray(ramp.numpy().astype("uint16")).save(tmp_path / split / f"c{c}" / f"{i}.png")
    common = [*STRETCH, "data.val_resize_mode=whole", "data.val_resize=32"]
    a = first_val_batch(tmp_path, "loader=dali_cpu", *common)
    b = first_val_batch(tmp_path, "loader=pytorch", "loader.num_workers=0", *common)
    assert (a - b).abs().mean().item() < 0.05, (a.mean().item(), b.mean().item())


@pytest.mark.parametrize("mode, resize", [("whole", 32), ("shorter", 32)])
def test_val_resize_mode_agrees_between_dali_and_pytorch(wide_root, mode, resize):
    common = [*STRETCH, f"data.val_resize_mode={mode}", f"data.val_resize={resize}"]
    a = first_val_batch(wide_root, "loader=dali_cpu", *common)
    b = first_val_batch(wide_root, "loader=pytorch", "loader.num_workers=0", *common)
    assert a.shape == b.shape == (4, 3, 32, 32)
    assert (a - b).abs().mean().item() < 0.05  # resize filters differ (DALI triangular, PIL antialiased bilinear)


def test_whole_image_squish_keeps_the_full_width_the_shorter_side_crop_does_not(wide_root):
    whole = first_val_batch(wide_root, "loader=dali_cpu", *STRETCH, "data.val_resize_mode=whole", "data.val_resize=32")
    crop = first_val_batch(wide_root, "loader=dali_cpu", *STRETCH, "data.val_resize_mode=shorter", "data.val_resize=32")
    # Red is a left-to-right ramp: the squished image spans all of it, the center crop only its middle half.
    span_whole = whole[:, 0, :, -1].mean() - whole[:, 0, :, 0].mean()
    span_crop = crop[:, 0, :, -1].mean() - crop[:, 0, :, 0].mean()
    assert span_whole > 1.6 * span_crop > 0


@pytest.mark.parametrize("name", ["dali_cpu", "pytorch"])
def test_train_resize_is_the_whole_image_squished_then_maybe_flipped(wide_root, name):
    ld = loaders(
        wide_root,
        f"loader={name}",
        *workers(name, 0),
        *STRETCH,
        "data.val_resize_mode=whole",
        "data.val_resize=32",
    )
    ld.train.set_epoch(0)
    reference = torch.cat([images for images, _ in ld.val])  # val: the same squish, no flip, no crop
    flips = 0
    for images, _ in ld.train:
        for image in images:
            # Every train image is some val image, as it is or mirrored: nothing was cropped away.
            plain = (reference - image).abs().amax(dim=(1, 2, 3)).min()
            mirrored = (reference - image.flip(-1)).abs().amax(dim=(1, 2, 3)).min()
            assert min(plain, mirrored) < 1e-3
            flips += bool(mirrored < plain)
    assert 0 < flips < 8  # a random flip: neither always nor never


@pytest.mark.parametrize("name", ["dali_cpu", "pytorch"])
def test_train_random_square_crop_keeps_the_aspect_and_moves_along_the_longer_side(wide_root, name):
    """fastai's Resize(size) (method crop): the 96x48 ramp's shorter side scaled to 32, then a 32x32
    square of the 64x32 image: half the ramp's span (the squish would show all of it), no
    stretch, at a random place."""
    ld = loaders(
        wide_root, f"loader={name}", *workers(name, 0), *STRETCH, "data.train_transform=random_square_crop",
        "data.val_resize=32",
    )  # fmt: skip
    ld.train.set_epoch(0)
    full = 1 / 0.229  # the ramp's 0..255 in red, normalized by ImageNet's red std
    lows = []
    for images, _ in ld.train:
        for image in images:
            red = image[0].float()
            left, right = red[:, 0].mean().item(), red[:, -1].mean().item()
            assert 0.42 * full < abs(right - left) < 0.56 * full, (left, right)
            lows.append(min(left, right))
    assert max(lows) - min(lows) > 0.25 * full, lows  # the square's place varies


def test_unknown_transform_names_are_one_line_errors(wide_root):
    from dali_train.errors import UserError  # checked by the schema (dali_train.config), before any loader

    with pytest.raises(UserError, match="data.train_transform=crop: unknown; choose one of random_resized_crop, resize, random_square_crop"):
        loaders(wide_root, "data.train_transform=crop")
    with pytest.raises(UserError, match="data.val_resize_mode=longer: unknown"):
        loaders(wide_root, "data.val_resize_mode=longer")


def test_an_image_past_pils_decompression_bomb_limit_reads_as_in_dali(tmp_path):
    """13,400 x 13,400 px (180M, 4 MB of JPEG): DALI decodes it, and loader=pytorch raised PIL's
    DecompressionBombError when it reached the file, hours into an epoch."""
    from dali_train.data.pil_image import load_rgb

    path = tmp_path / "large.JPEG"
    Image.new("L", (13_400, 13_400), 128).save(path, quality=50)
    image = load_rgb(str(path))
    assert image.size == (13_400, 13_400) and image.mode == "RGB" and image.getpixel((0, 0)) == (128, 128, 128)
