"""build_model: timm names and model.kwargs reach timm.create_model; mistakes are one-line errors."""

from __future__ import annotations

import pytest
import torch
from timm.layers import BlurPool2d

from dali_train.config import ModelConfig
from dali_train.distributed import DistInfo
from dali_train.errors import UserError
from dali_train.models import ModelError, build_model, wrap_for_training


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


def test_an_attn_layer_mapping_builds_the_layer_with_its_arguments():
    kwargs = {"act_layer": "mish", "block_args": {"attn_layer": {"name": "se", "act_layer": "mish", "rd_ratio": 0.25}}}
    model = build_model(ModelConfig(name="resnet50d", kwargs=kwargs), 10)
    se = model.layer1[0].se
    assert type(se).__name__ == "SEModule" and isinstance(se.act, torch.nn.Mish)
    assert se.fc1.out_channels == 64  # 256 channels x rd_ratio 0.25
    assert not any(isinstance(m, torch.nn.ReLU) for m in model.modules())
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 10)
    with pytest.raises(ModelError, match=r"model.kwargs.block_args.attn_layer.name=sse: not a timm attention layer"):
        build_model(ModelConfig(name="resnet50d", kwargs={"block_args": {"attn_layer": {"name": "sse"}}}), 10)


def test_unknown_model_and_rejected_kwargs_are_one_line_errors():
    with pytest.raises(ModelError, match="model.name=resnet5: not a timm model"):
        build_model(ModelConfig(name="resnet5"), 10)
    with pytest.raises(ModelError, match=r"model.kwargs=.*no_such_arg.*resnet18 rejected them") as e:
        build_model(ModelConfig(name="resnet18", kwargs={"no_such_arg": 1}), 10)
    assert "\n" not in str(e.value)


def _blur_pools(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, BlurPool2d)]


def test_stem_blur_pool_blurs_the_stem_only_and_keeps_the_shapes():
    plain = build_model(ModelConfig(name="resnet18d"), 10)
    blurred = build_model(ModelConfig(name="resnet18d", stem_blur_pool=True), 10)
    assert _blur_pools(plain) == [] and _blur_pools(blurred) == ["maxpool.1"]  # no strided block blurred
    assert blurred.maxpool[0].stride == 1 and blurred.maxpool[1].stride == 2
    assert _blur_pools(build_model(ModelConfig(name="resnetblur18"), 10)) != ["maxpool.1"]  # what timm's aa_layer does
    x = torch.randn(2, 3, 64, 64)
    stem = torch.nn.Sequential(blurred.conv1, blurred.bn1, blurred.act1)
    assert blurred.maxpool(stem(x)).shape == plain.maxpool(stem(x)).shape == (2, 64, 16, 16)
    assert blurred(x).shape == (2, 10)


@pytest.mark.parametrize("name", ["resnetblur18", "test_vit"])
def test_stem_blur_pool_on_a_model_without_a_max_pool_stem_is_a_one_line_error(name):
    with pytest.raises(ModelError, match=r"model.stem_blur_pool=true: needs a timm ResNet-family model") as e:
        build_model(ModelConfig(name=name, stem_blur_pool=True), 10)
    assert "\n" not in str(e.value)


def test_blur_strided_convs_blurs_before_every_strided_conv_of_16_channels_or_more():
    """FFCV's rule (use_blurpool): the stem conv (3 input channels) stays; the strided 3x3 and 1x1
    shortcut convs of layers 2-4 get a binomial blur at stride 1 before them, their stride kept."""
    plain = build_model(ModelConfig(name="resnet18"), 10)
    blurred = build_model(ModelConfig(name="resnet18", blur_strided_convs=True), 10)
    strided = [n for n, m in plain.named_modules() if isinstance(m, torch.nn.Conv2d) and m.stride == (2, 2)]
    assert strided[0] == "conv1" and len(strided) == 7
    assert _blur_pools(blurred) == [f"{n}.0" for n in strided[1:]]
    wrapped = blurred.layer2[0].downsample[0]
    blur, conv = wrapped
    assert conv.stride == (2, 2) and blur.stride == 1
    x = torch.randn(2, 64, 9, 9)
    binomial = torch.tensor([1.0, 2.0, 1.0])
    kernel = (binomial[:, None] * binomial[None, :] / 16).expand(64, 1, 3, 3)
    expected = conv(torch.nn.functional.conv2d(x, kernel, padding=1, groups=64))  # zero padding, as FFCV
    torch.testing.assert_close(wrapped(x), expected)
    assert blurred(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    with torch.profiler.profile() as prof:  # the zero padding is the conv's, not one more pass over x
        blur(x)
    ops = {e.name for e in prof.events()}
    assert "aten::conv2d" in ops and not ops & {"aten::pad", "aten::constant_pad_nd"}
    with pytest.raises(ModelError, match=r"model.blur_strided_convs=true: VisionTransformer has no strided"):
        build_model(ModelConfig(name="test_vit", blur_strided_convs=True), 10)


@pytest.mark.parametrize("layout", ["unblurred", "ffcv"])  # NAME.weight, or FFCV's BlurPoolConv2d: NAME.conv.weight
def test_pretrained_weights_load_into_the_blurred_convs(tmp_path, layout):
    plain = build_model(ModelConfig(name="resnet18"), 10)
    state = plain.state_dict()
    if layout == "ffcv":  # FFCV's BlurPoolConv2d also saves its filter, a persistent buffer
        state = {k.replace("layer2.0.conv1.", "layer2.0.conv1.conv."): v for k, v in state.items()}
        state["layer2.0.conv1.blur_filter"] = torch.full((64, 1, 3, 3), 1 / 16)
    torch.save(state, tmp_path / "w.pt")
    blurred = build_model(ModelConfig(name="resnet18", blur_strided_convs=True, pretrained=str(tmp_path / "w.pt")), 10)
    torch.testing.assert_close(blurred.layer2[0].conv1[1].weight, plain.layer2[0].conv1.weight)
    torch.testing.assert_close(blurred.layer4[0].downsample[0][1].weight, plain.layer4[0].downsample[0].weight)


@pytest.mark.parametrize(("warmup", "expected_decay"), [(False, 0.999), (True, 1 - 2 ** (-2 / 3))])
def test_ema_warmup_lets_the_first_updates_follow_the_model(warmup, expected_decay):
    """timm's EMA warmup: decay 1 - (1 + t)^(-2/3) (0.37 at t = 1), capped at ema_decay; without it a
    short run's EMA would still be mostly its random initialization. (timm's t is the update count
    minus one: update 1 copies the model either way.)"""
    net = torch.nn.Linear(3, 2)
    model, ema = wrap_for_training(
        net, torch.device("cpu"), DistInfo(0, 0, 1), channels_last=False, sync_bn=False, ema_decay=0.999,
        compile=False, ema_warmup=warmup,
    )  # fmt: skip
    start = ema.module.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model, step=2)
    moved = (ema.module.weight - start).mean().item()
    assert moved == pytest.approx(1 - expected_decay, rel=1e-4)


def test_an_ema_decay_of_zero_is_an_ema_that_follows_the_model():
    """trainer.ema=true trainer.ema_decay=0 was accepted and made no EMA at all (0 read as off)."""
    model, ema = wrap_for_training(
        torch.nn.Linear(3, 2), torch.device("cpu"), DistInfo(0, 0, 1), channels_last=False, sync_bn=False,
        ema_decay=0.0, compile=False,
    )  # fmt: skip
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model, step=5)
    torch.testing.assert_close(ema.module.weight, model.weight)


def test_weight_init_fan_in_draws_convs_and_the_head_by_fan_in_and_keeps_the_zeroed_norms():
    """fastai's init_cnn: std sqrt(2 / fan_in) for every conv and linear weight, zero biases; timm's
    own draws a grouped conv by fan-out (here 32·9 against 4·9), 2.8x smaller."""
    kwargs = {"cardinality": 8, "base_width": 4, "block_args": {"attn_layer": "se"}}
    torch.manual_seed(0)
    timm_init = build_model(ModelConfig(name="resnet26d", kwargs=kwargs), 10)
    fan_in = build_model(ModelConfig(name="resnet26d", kwargs=kwargs, weight_init="fan_in"), 10)
    grouped = fan_in.layer1[0].conv2
    assert grouped.groups == 8 and grouped.weight.shape == (32, 4, 3, 3)
    assert grouped.weight.std().item() == pytest.approx((2 / 36) ** 0.5, rel=0.05)
    assert timm_init.layer1[0].conv2.weight.std().item() == pytest.approx((2 / 288) ** 0.5, rel=0.05)
    head_fan_in = fan_in.fc.weight.shape[1]
    assert fan_in.fc.weight.std().item() == pytest.approx((2 / head_fan_in) ** 0.5, rel=0.1)
    assert not fan_in.fc.bias.any() and not fan_in.layer1[0].se.fc1.bias.any()
    assert not fan_in.layer1[0].bn3.weight.any()  # the block still starts as the identity
    assert fan_in(torch.randn(2, 3, 64, 64)).shape == (2, 10)


def test_weight_init_fan_in_on_a_model_outside_the_resnet_family_is_a_one_line_error():
    """It would overwrite inits of their own (resnetv2 zeroes its blocks' last conv; ViT its head)."""
    with pytest.raises(ModelError, match=r"model.weight_init=fan_in: fastai's init for timm ResNet-family") as e:
        build_model(ModelConfig(name="test_vit", weight_init="fan_in"), 10)
    assert "\n" not in str(e.value)


def test_an_unknown_weight_init_is_a_one_line_error():
    with pytest.raises(UserError, match=r"model.weight_init") as e:
        ModelConfig(name="resnet18", weight_init="xavier")
    assert "\n" not in str(e.value)


def test_self_attention_and_ffcvs_blur_together_on_a_basic_block_resnet():
    """The blur wrapped layer2's first conv (strided in a BasicBlock ResNet) before the attention
    layer read its width: an AttributeError mid-setup."""
    model = build_model(ModelConfig(name="resnet18", self_attention=True, blur_strided_convs=True), 10)
    assert isinstance(model.layer2[0].conv1, torch.nn.Sequential) and model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
