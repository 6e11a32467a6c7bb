"""A test-only timm model whose forward raises CUDA's out-of-memory error (a real OOM needs a GPU).
Importing this module registers it as `model.name=test_out_of_memory_net`."""

import torch
from timm.models import register_model

NAME = "test_out_of_memory_net"


class _OutOfMemoryNet(torch.nn.Module):
    def __init__(self, num_classes: int = 1000, **kwargs) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@register_model
def test_out_of_memory_net(pretrained: bool = False, **kwargs) -> torch.nn.Module:
    return _OutOfMemoryNet(num_classes=kwargs.get("num_classes", 1000))


EVAL_NAME = "test_out_of_memory_in_eval_net"


class _OutOfMemoryInEvalNet(torch.nn.Module):
    """Trains; runs out of memory in eval mode, as a model can at validation's larger side."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.fc(x.float().mean((2, 3)))


@register_model
def test_out_of_memory_in_eval_net(pretrained: bool = False, **kwargs) -> torch.nn.Module:
    return _OutOfMemoryInEvalNet(num_classes=kwargs.get("num_classes", 1000))


ABOVE_40PX_NAME = "test_out_of_memory_above_40px_net"


class _OutOfMemoryAbove40pxNet(torch.nn.Module):
    """Trains on images up to 40 px; a larger training batch runs out of memory, as a progressive
    ramp's last crop can where its first fits."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[-1] > 40:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.fc(x.float().mean((2, 3)))


@register_model
def test_out_of_memory_above_40px_net(pretrained: bool = False, **kwargs) -> torch.nn.Module:
    return _OutOfMemoryAbove40pxNet(num_classes=kwargs.get("num_classes", 1000))
