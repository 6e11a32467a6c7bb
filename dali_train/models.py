"""Models: a thin `build_model` over `timm.create_model` (weights only from local files), and
`wrap_for_training`: the model on its device, with EMA, compile and DDP in the order that works."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from pathlib import Path

import timm
import torch
from timm.layers import BlurPool2d, get_attn
from timm.models import clean_state_dict
from timm.utils import ModelEmaV3

from dali_train.attention import add_self_attention
from dali_train.config import ModelConfig
from dali_train.distributed import DistInfo
from dali_train.errors import UserError
from dali_train.resume_fit import check_evaluated_network

log = logging.getLogger(__name__)


class ModelError(UserError):
    """A model option the user must fix; one line."""


def build_model(spec: ModelConfig, num_classes: int, *, evaluate: bool = False) -> torch.nn.Module:
    """`timm.create_model(spec.name, **spec.kwargs)`: kwargs reach the model class (timm's ResNet
    takes act_layer, aa_layer, block_args={attn_layer: se}, cardinality, base_width, stem_type, ...),
    plus fastai's self-attention layer when asked, then the weights of `spec.pretrained` when set
    (`evaluate`, trainer.eval_only: every tensor from the file, built as it was trained)."""
    name = spec.name
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('.')[0][:6]}*")[:5]
        raise ModelError(f"model.name={name}: not a timm model (similar: {', '.join(close) or 'none'})")
    kwargs = _with_attn_layers(dict(spec.kwargs))
    if spec.drop_path_rate:
        kwargs["drop_path_rate"] = spec.drop_path_rate
    try:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    except (TypeError, ValueError, KeyError, AssertionError) as e:  # a kwarg the model class does not take
        raise ModelError(f"model.kwargs={kwargs}: {name} rejected them ({type(e).__name__}: {e})") from None
    if spec.weight_init == "fan_in":
        if not isinstance(model, timm.models.resnet.ResNet):  # others zero-init convs or heads of their own
            raise ModelError(
                f"model.weight_init=fan_in: fastai's init for timm ResNet-family models (resnet*, resnext*, "
                f"resnetblur*), not {name} ({type(model).__name__}), whose own inits it would overwrite"
            )
        init_fan_in(model)
    if spec.stem_blur_pool:
        blur_stem_pool(model)
    if spec.self_attention:  # before the blurs wrap layer2's first conv, whose width it reads
        add_self_attention(model)
    if spec.blur_strided_convs:
        blur_strided_convs(model)
    if spec.pretrained:
        evaluated = dataclasses.asdict(spec) if evaluate else None
        load_pretrained(model, spec.pretrained, strict=spec.pretrained_strict, evaluate=evaluated)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s, %.1fM parameters, %d classes", name, n_params / 1e6, num_classes)
    return model


def _with_attn_layers(kwargs: dict) -> dict:
    """kwargs with each `attn_layer` given as a mapping ({name: se, act_layer: mish}, at the top or in
    block_args) made the layer class with those arguments: timm takes a name or a class, and a name
    alone builds timm's SE with ReLU where fastai's SE uses the block's activation."""

    def build(where: str, spec: object) -> object:
        if not isinstance(spec, Mapping):
            return spec
        args = dict(spec)
        name = args.pop("name", None)
        try:
            layer = get_attn(name) if isinstance(name, str) else None
        except AssertionError:
            layer = None
        if layer is None:
            raise ModelError(f"model.kwargs.{where}.name={name}: not a timm attention layer (se, eca, cbam, ...)")
        return functools.partial(layer, **args)

    if "attn_layer" in kwargs:
        kwargs["attn_layer"] = build("attn_layer", kwargs["attn_layer"])
    if isinstance(kwargs.get("block_args"), Mapping) and "attn_layer" in kwargs["block_args"]:
        block_args = dict(kwargs["block_args"])
        block_args["attn_layer"] = build("block_args.attn_layer", block_args["attn_layer"])
        kwargs["block_args"] = block_args
    return kwargs


def init_fan_in(model: torch.nn.Module) -> torch.nn.Module:
    """fastai's `init_cnn`: every conv and linear weight Kaiming-normal by fan-in, every bias zero.
    timm's ResNets draw convs by fan-out, which for a grouped 3x3 conv (ResNeXt 32x4d: fan-in 36,
    fan-out 1152 at the first stage) makes the weights 5.7x smaller; with BatchNorm after them and
    Adam-type steps of a set size, that is a 5.7x larger relative step on those layers. Norm layers
    (and timm's zero-initialized last norm of each block) are left as they are."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    return model


def blur_stem_pool(model: torch.nn.Module) -> torch.nn.Module:
    """fastai's MaxBlurPool in place of a timm ResNet's stem max pool: max over 3×3 at stride 1, then
    a 3×3 binomial blur at stride 2. timm's `aa_layer` (the resnetblur models) does this and also
    blurs every strided block; the Imagenette leaderboard entries blur the stem only."""
    pool = getattr(model, "maxpool", None)
    stage = getattr(model, "layer1", None)
    if not isinstance(pool, torch.nn.MaxPool2d) or not isinstance(stage, torch.nn.Sequential):
        raise ModelError(
            f"model.stem_blur_pool=true: needs a timm ResNet-family model with a max-pool stem and no aa_layer, "
            f"not {type(model).__name__} (stem pool: {type(pool).__name__})"
        )
    channels = model.bn1.num_features  # what the stem puts out
    model.maxpool = torch.nn.Sequential(torch.nn.MaxPool2d(3, stride=1, padding=1), BlurPool2d(channels, stride=2))
    return model


class ZeroPaddedBlur(BlurPool2d):
    """FFCV's blur: timm's 3×3 binomial BlurPool2d at stride 1 with zero padding, done by the
    convolution itself; timm's forward pads in a separate F.pad, one more kernel and pass over the
    activation per blur, forward and backward."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, filt_size=3, stride=1, pad_mode="constant")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, self.filt, padding=1, groups=self.channels)


def blur_strided_convs(model: torch.nn.Module) -> torch.nn.Module:
    """FFCV's BlurPool (its ResNet recipes' `use_blurpool`): every Conv2d with a stride and at least
    16 input channels becomes (3×3 binomial blur at stride 1, zero padding; the conv, stride kept).
    timm's `aa_layer` differs: it replaces the 3×3 conv's stride by a blur at stride 2 and leaves
    the 1×1 shortcut convs unblurred."""
    strided = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, torch.nn.Conv2d) and max(child.stride) > 1 and child.in_channels >= 16
    ]
    if not strided:
        raise ModelError(
            f"model.blur_strided_convs=true: {type(model).__name__} has no strided Conv2d with 16 or more input channels"
        )
    for parent, name, conv in strided:
        blur = ZeroPaddedBlur(conv.in_channels)
        setattr(parent, name, torch.nn.Sequential(blur, conv))
    return model


def _blurred_conv_keys(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the weights of each conv that `blur_strided_convs` wrapped (now `NAME.1.*`) taken
    from `NAME.*` (an unblurred model's file) or `NAME.conv.*` (FFCV's BlurPoolConv2d, whose saved
    `NAME.blur_filter` buffer is dropped)."""
    state = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential) and len(module) == 2 and isinstance(module[0], BlurPool2d):
            for tensor in ("weight", "bias"):
                for source in (f"{name}.{tensor}", f"{name}.conv.{tensor}"):
                    if source in state and f"{name}.1.{tensor}" not in state:
                        state[f"{name}.1.{tensor}"] = state.pop(source)
            state.pop(f"{name}.blur_filter", None)  # FFCV's fixed 3x3 binomial filter: ours is built, not loaded
    return state


def read_weights(path: str) -> tuple[dict[str, torch.Tensor], str, dict | None]:
    """(state_dict, which, ours) from a local file: a raw state_dict, a .safetensors file, or a training
    checkpoint (ours or timm's: its EMA weights when it has them, as best.pt is chosen on them); `ours`
    is the whole file when it is a dali-train checkpoint (it records how its network was built).
    Read with weights_only=True: a file that needs more than tensors and plain containers is refused."""
    if not Path(path).is_file():
        raise ModelError(f"model.pretrained={path}: no such file (weights are never downloaded)")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure means "not a weights file we can read safely"
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ModelError(
            f"model.pretrained={path}: not a weights file readable without running code ({type(e).__name__}: {reason})"
        ) from None
    which = "weights"
    ours = state if isinstance(state, dict) and "model_name" in state and "format_version" in state else None
    if isinstance(state, dict):
        for key in ("model_ema", "state_dict_ema", "state_dict", "model"):  # timm's order, EMA first
            if isinstance(state.get(key), dict):
                state, which = state[key], ("EMA weights" if key.endswith("ema") else f"'{key}' weights")
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"model.pretrained={path}: holds no state_dict of tensors")
    return clean_state_dict(state), which, ours


def load_pretrained(
    model: torch.nn.Module, path: str, *, strict: bool = True, evaluate: Mapping | None = None
) -> None:
    """Weights from a local file. Strict: every tensor of the model must be in the file with its
    shape, except a classifier of another size (fine-tuning on other classes: left at its fresh
    initialization). Not strict: what fits is loaded, with a warning that counts the rest.
    `evaluate` (the model options of a trainer.eval_only run): no tensor may be left at its
    initialization, the head included, nor any of the file unused, and one of our checkpoints must be
    evaluated as the network it was trained as (resume_fit.check_evaluated_network): its top-1 would
    be another network's."""
    state, which, ours = read_weights(path)
    state = _blurred_conv_keys(model, state)
    own = model.state_dict()
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    classifier = (getattr(model, "pretrained_cfg", None) or {}).get("classifier")
    head = {k for k in own if classifier and k.startswith(f"{classifier}.") and k in state and k not in fits}
    missing = [k for k in own if k not in fits and k not in head]
    unused = [k for k in state if k not in own]
    if not fits:
        raise ModelError(f"model.pretrained={path}: no tensor matches this model's parameters")
    if evaluate is not None and ours is not None:
        check_evaluated_network(ours, evaluate, path)
    if evaluate is not None and (missing or head):
        first = (missing or sorted(head))[0]
        theirs = list(state[first].shape) if first in state else "absent"
        raise ModelError(
            f"model.pretrained={path}: trainer.eval_only=true would evaluate {len(missing) + len(head)} of {len(own)} "
            f"tensors at their fresh initialization (e.g. {first}: {theirs} in the file, {list(own[first].shape)} "
            f"here{', another class count' if head else ''}); evaluate it as the model it was trained as"
        )
    if evaluate is not None and unused:  # e.g. a self-attention layer this model lacks: another network
        raise ModelError(
            f"model.pretrained={path}: trainer.eval_only=true would leave {len(unused)} tensors of the file unused "
            f"(e.g. {unused[0]}): it was trained as another network; evaluate it as the model it was trained as"
        )
    if strict and (missing or unused):
        raise ModelError(
            f"model.pretrained={path}: {len(missing)} of {len(own)} tensors of this model are missing or differ in "
            f"shape (e.g. {missing[:2]}), {len(unused)} in the file are unused; set model.pretrained_strict=false "
            f"to load the {len(fits)} that fit"
        )
    model.load_state_dict(fits, strict=False)
    if head:
        log.info("model: classifier %s left at its fresh initialization (another class count)", classifier)
    if missing or unused:
        log.warning(
            "model: %d/%d tensors loaded from %s (%s); %d left at initialization, %d in the file unused",
            len(fits),
            len(own),
            path,
            which,
            len(missing),
            len(unused),
        )
    else:
        log.info("model: %d/%d tensors loaded from %s (%s)", len(fits), len(own), path, which)


def wrap_for_training(
    model: torch.nn.Module,
    device: torch.device,
    dist: DistInfo,
    *,
    channels_last: bool,
    sync_bn: bool,
    ema_decay: float | None,
    compile: bool,
    ema_warmup: bool = False,
    compile_mode: str = "default",
) -> tuple[torch.nn.Module, ModelEmaV3 | None]:
    """(model to train, EMA copy or None): to device → channels_last → SyncBN → EMA → compile → DDP.

    The order matters: EMA copies the model on its device before compile/DDP wrap it (timm's
    rule), and compile comes before DDP so DDP's hooks see the compiled graph's buckets.

    With CUDA graphs (reduce-overhead) torch's cudagraph trees copy each non-static input (a DALI
    batch, whose buffer DALI reuses) into the graph's own buffer, and a step's outputs are consumed
    (loss, backward) before the next forward replays: no `cudagraph_mark_step_begin` or clone is
    needed in the training loop, whose forward/backward pairs mark the steps themselves."""
    model = model.to(device)
    if channels_last and device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if sync_bn and dist.enabled:
        if device.type != "cuda":  # DDP refuses SyncBatchNorm on CPU modules (a ValueError mid-setup)
            raise ModelError("trainer.sync_bn=true: torch's SyncBatchNorm runs on CUDA devices only; set it false on CPU")
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ema = ModelEmaV3(model, decay=ema_decay, use_warmup=ema_warmup, device=device) if ema_decay is not None else None
    if compile:
        model = torch.compile(model, mode=compile_mode)
    if dist.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return model, ema
