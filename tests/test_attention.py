"""fastai's self-attention layer: the formula, its identity start, and where build_model puts it."""

from __future__ import annotations

import pytest
import torch

from dali_train.attention import SimpleSelfAttention
from dali_train.config import ModelConfig
from dali_train.errors import UserError
from dali_train.models import build_model


def test_layer_computes_x_plus_gamma_affinity_times_projection_and_starts_as_identity():
    torch.manual_seed(0)
    layer = SimpleSelfAttention(8).eval()  # eval: no power iteration, the weight stays as read below
    x = torch.randn(3, 8, 5, 4).to(memory_format=torch.channels_last)
    assert torch.equal(layer(x), x)  # gamma = 0
    with torch.no_grad():
        layer.gamma.fill_(0.5)
    w = layer.proj.weight.detach().squeeze(-1)  # the spectrally normalized 1×1 projection
    flat = x.reshape(3, 8, 20)
    expected = flat + 0.5 * torch.einsum("bcm,bdm,de,ben->bcn", flat, flat, w, flat)
    torch.testing.assert_close(layer(x), expected.view(3, 8, 5, 4), rtol=1e-4, atol=1e-4)
    assert torch.linalg.matrix_norm(w, ord=2).item() == pytest.approx(1.0, rel=0.05)  # spectral norm holds it at 1


def test_fp16_autocast_computes_the_cubic_term_in_fp32():
    torch.manual_seed(0)
    layer = SimpleSelfAttention(64).eval()  # eval: the spectral norm's power iteration holds still
    x = torch.randn(2, 64, 32, 32).relu() * 4  # large enough that (X Xᵀ)(W X) passes fp16's 65504
    with torch.no_grad():
        layer.gamma.fill_(0.5)
        expected = layer(x)
        with torch.autocast("cpu", dtype=torch.float16):
            got = layer(x)  # autocast would run the two bmm in fp16
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected)


def test_build_model_puts_it_after_the_se_of_layer1s_last_block_and_it_trains():
    kwargs = {"block_args": {"attn_layer": "se"}}
    model = build_model(ModelConfig(name="resnet18", kwargs=kwargs, self_attention=True), 10)
    block = model.layer1[-1]
    assert type(block.se[0]).__name__ == "SEModule" and isinstance(block.se[1], SimpleSelfAttention)
    assert block.se[1].proj.in_channels == 64
    assert sum(isinstance(m, SimpleSelfAttention) for m in model.modules()) == 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for _ in range(2):  # the block's last BN starts at zero, so γ gets a gradient from the second step
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert block.se[1].gamma.item() != 0.0
    plain = build_model(ModelConfig(name="resnet18", self_attention=True), 10)  # no SE: the layer alone
    assert isinstance(plain.layer1[-1].se, SimpleSelfAttention)


def test_a_model_without_resnet_stages_is_a_one_line_error():
    with pytest.raises(UserError, match="model.self_attention=true: needs a timm ResNet-family model") as e:
        build_model(ModelConfig(name="vit_tiny_patch16_224", kwargs={"img_size": 32}, self_attention=True), 10)
    assert "\n" not in str(e.value)
