"""dali-train: ImageNet-style training with GPU JPEG decoding (NVIDIA DALI), configured by Hydra."""

__version__ = "0.1.0"
