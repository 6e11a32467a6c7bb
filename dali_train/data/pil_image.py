"""An image file read by PIL as DALI's decoders read it: 8-bit RGB (loader=pytorch, scripts)."""

from __future__ import annotations

import numpy as np
from PIL import Image

# PIL's decompression-bomb guard (an error above 179M pixels, a warning per read above 89M) stopped
# loader=pytorch hours in on a real 180M-pixel photo that the startup check and DALI accept. Raised,
# not lifted: an error above 1 gigapixel still names a header that lies (a damaged file), where PIL
# would allocate gigabytes per worker. Set on importing dali_train.data, so that every reader of ours
# (loader=pytorch, the search for the file DALI failed on, scripts/scan_dataset.py) reads alike.
Image.MAX_IMAGE_PIXELS = 500_000_000  # PIL raises above twice this


def as_rgb(im: Image.Image) -> Image.Image:
    """8-bit RGB. A 16-bit grayscale image (PNG, TIFF: PIL's modes I;16 and I) is scaled to 8 bits as
    decoders do; PIL's convert would clip it at 255 (a gradient came out white)."""
    if im.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        levels = np.asarray(im).astype(np.float64) / 257
        im = Image.fromarray(levels.clip(0, 255).round().astype(np.uint8))  # mode L
    return im.convert("RGB")


def load_rgb(path: str) -> Image.Image:
    """torchvision's default_loader, with `as_rgb`'s conversion."""
    with open(path, "rb") as f, Image.open(f) as im:
        return as_rgb(im)
