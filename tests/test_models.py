"""build_model: timm names and model.kwargs reach timm.create_model; mistakes are one-line errors."""

from __future__ import annotations

import pytest
import torch

from dali_train.config import ModelConfig
from dali_train.models import ModelError, build_model


def test_kwargs_build_an_se_resnext_with_mish_and_blur_pooling():
    kwargs = {"cardinality": 32, "base_width": 4, "act_layer": "mish", "block_args": {"attn_layer": "se"}}
    model = build_model(ModelConfig(name="resnetblur50d", kwargs=kwargs), 10)
    modules = list(model.modules())
    assert any(isinstance(m, torch.nn.Mish) for m in modules)
    se_acts = {id(m) for m in modules if type(m).__name__ == "SEModule" for m in m.modules()}
    assert not any(isinstance(m, torch.nn.ReLU) for m in modules if id(m) not in se_acts)  # SE keeps its ReLU
    assert model.layer1[0].conv2.groups == 32 and hasattr(model.layer1[0], "se")
    assert any(type(m).__name__ == "BlurPool2d" for m in modules)
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 10)


def test_unknown_model_and_rejected_kwargs_are_one_line_errors():
    with pytest.raises(ModelError, match="model.name=resnet5: not a timm model"):
        build_model(ModelConfig(name="resnet5"), 10)
    with pytest.raises(ModelError, match=r"model.kwargs=.*no_such_arg.*resnet18 rejected them") as e:
        build_model(ModelConfig(name="resnet18", kwargs={"no_such_arg": 1}), 10)
    assert "\n" not in str(e.value)
