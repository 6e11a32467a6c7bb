"""Why a config did not compose or convert, as one line naming the key: Hydra's composition errors
(several lines with hints), OmegaConf's key errors, required values nobody set, keys added past the
schema with `+`, and a shared recipe part chosen as a recipe. train.py and the scripts print these
lines; config.py raises them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dali_train.errors import UserError


def key_line(e: OmegaConfBaseException) -> str:
    """An OmegaConf error as one line naming its key: `optimizer.lr: Interpolation key ... not found`."""
    return f"{e.full_key or 'config'}: {str(e.msg).splitlines()[0]}"


def require_values(cfg: DictConfig) -> None:
    """A UserError naming the first key left `???` (a required value nobody set), or the first
    interpolation that does not resolve (`${oc.env:UNSET}`): finding what is missing resolves them."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as e:
        raise UserError(key_line(e)) from None
    if missing:
        raise UserError(f"{missing[0]}: no value; set it on the command line ({missing[0]}=...)")


def refuse_keys_past_the_schema(cfg: DictConfig, prefix: str = "") -> None:
    """A UserError for a key its section's schema lacks. Hydra's `+trainer.epoch=10` (and
    `+optimizer.kwargs.fused=true` under optimizer=sgd, as Hydra's own hint suggests) adds keys past
    the struct flag; OmegaConf.to_object then drops them or keeps them unread: a run without them."""
    schema = OmegaConf.get_type(cfg)
    known = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in cfg.keys():
        if known is not None and key not in known:
            section = prefix.rstrip(".") or "the config"
            raise UserError(
                f"{prefix}{key}: not a key of {section} ({schema.__name__}); its keys: {', '.join(sorted(known))}"
            )
        node = cfg._get_node(key)  # the node, not its value: nothing resolves here
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            refuse_keys_past_the_schema(node, f"{prefix}{key}.")


def check_experiment_choice(choice: str | None) -> None:
    """A UserError for `+experiment=base/...`: such a file is what several recipes share (each sets
    the values that differ, epochs among them), and alone it would train with the schema's defaults
    for those, a recipe no one wrote. Its `???` could not say so: merged onto a set default, OmegaConf
    keeps the default."""
    if choice and choice.split("/")[0] == "base":
        folder = Path(__file__).resolve().parents[1] / "conf" / "experiment"
        part = choice.removeprefix("base/")
        users = sorted(p.stem for p in folder.glob("*.yaml") if f"base/{part}" in p.read_text(encoding="utf-8"))
        raise UserError(
            f"experiment={choice}: a part that recipes share, not a recipe; choose one of them: "
            f"{', '.join(f'+experiment={name}' for name in users) or 'none uses it'}"
        )


def composition_error_line(error: BaseException) -> str:
    """Hydra's composition errors (several lines: what failed, a hint, OmegaConf's key/type lines)
    as one line naming the key: `loader.num_threads: Key 'num_threads' not in 'PytorchLoaderConfig'`."""
    cause = error
    while cause.__cause__ is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        return key_line(cause)
    parts: list[str] = []  # "Available options in 'loader':" and its indented list become one part
    listing = False
    for raw in str(error).splitlines():
        line = raw.strip()
        if line.startswith("Config search path"):
            break
        if not line or line.endswith("_schema"):  # the schemas are options of their group to Hydra only
            continue
        if listing and raw[0].isspace():
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
            continue
        listing = line.endswith(":")
        parts.append(line)
    return "; ".join(parts) or type(error).__name__
