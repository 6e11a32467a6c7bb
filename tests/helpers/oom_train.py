"""train.py as users run it, with one test-only timm model whose forward raises CUDA's
out-of-memory error (a real OOM needs a GPU): `python oom_train.py OVERRIDES...`."""

import runpy
import sys
from pathlib import Path

import torch
from timm.models import register_model


class _OutOfMemoryNet(torch.nn.Module):
    def __init__(self, num_classes: int = 1000, **kwargs) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@register_model
def test_out_of_memory_net(pretrained: bool = False, **kwargs) -> torch.nn.Module:
    return _OutOfMemoryNet(num_classes=kwargs.get("num_classes", 1000))


train_py = Path(__file__).resolve().parents[2] / "train.py"
sys.argv = [str(train_py), *sys.argv[1:]]
sys.path[0] = str(train_py.parent)  # as `python train.py` sets it: this checkout's dali_train
runpy.run_path(str(train_py), run_name="__main__")
