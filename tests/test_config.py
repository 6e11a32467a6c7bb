"""Every config option composes; typos and bad values fail at composition with Hydra's message."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dali_train.config import register_configs
from tests.conftest import REPO, run_train

CONF = REPO / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture
def hydra_conf():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def test_default_config_composes(hydra_conf):
    cfg = compose("config")
    assert cfg.loader.name == "dali" and cfg.model.name == "resnet18" and cfg.data.name == "sample"
    assert cfg.optimizer.name == "sgd" and cfg.scheduler.name == "cosine"


@pytest.mark.parametrize("group", ["loader", "model", "optimizer", "scheduler", "data"])
def test_every_option_of_a_group_composes(hydra_conf, group):
    names = options(group)
    assert names, f"conf/{group} is empty"
    for name in names:
        cfg = compose("config", overrides=[f"{group}={name}", "data.root=/x"])
        node = cfg[group]
        # The option name, the file name and the `name` key agree (models: timm names).
        if (group, name) == ("optimizer", "ranger"):  # a recipe of timm's optimizer under its own name
            assert node.name == "lookahead_radamw"
        elif group in ("loader", "optimizer", "scheduler", "data"):
            assert node.name == name
        OmegaConf.to_container(cfg.loader, throw_on_missing=True)


def test_default_sample_root_resolves_outside_hydra_main(hydra_conf):
    cfg = compose("config")
    assert cfg.data.root.endswith("/.cache/sample-v1") and cfg.data.generate_sample


def test_any_timm_model_by_name(hydra_conf):
    assert compose("config", overrides=["model.name=convnext_tiny"]).model.name == "convnext_tiny"


@pytest.mark.parametrize(
    "override", ["loader.batchsize=3", "optimizer.lrr=0.1", "optimizer.lr=abc", "trainer.epochs=two", "nosuchkey=1"]
)
def test_typos_and_wrong_types_fail_at_composition(hydra_conf, override):
    with pytest.raises(ConfigCompositionException):
        compose("config", overrides=[override])


def test_imagenet_root_is_required(hydra_conf):
    cfg = compose("config", overrides=["data=imagenet"])
    assert OmegaConf.is_missing(cfg.data, "root")


@pytest.mark.slow
def test_typo_on_the_command_line_exits_before_any_work(tmp_path):
    """Hydra's composition error, as users see it: its message, exit code 2 as for UserError."""
    proc = run_train(["loader.batchsize=3", f"hydra.run.dir={tmp_path / 'run'}"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "batchsize" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_config_prints_without_resolving_paths():
    proc = run_train(["--cfg", "job"], timeout=120)
    assert "loader:" in proc.stdout and "name: dali" in proc.stdout
    assert Path(REPO / "conf" / "config.yaml").is_file()
