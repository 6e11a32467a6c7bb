"""Every recipe in conf/experiment composes, names its source, and runs one training step."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from dali_train.config import register_configs
from tests.conftest import REPO, run_inprocess

RECIPES = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def test_the_recipes_the_docs_promise_exist():
    expected = {
        "imagenet_rn50_90ep",
        "imagenet_rn50_90ep_nvidia",
        "imagenet_rn18_ffcv_16ep",
        "imagenet_rn18_ffcv_88ep",
        "imagenette_128_5ep",
        "imagenette_128_20ep",
    } | {f"imagenet_rn50_ffcv_{e}ep" for e in (16, 24, 32, 40, 88)}
    assert expected <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_and_names_its_published_number(recipe):
    text = (REPO / "conf" / "experiment" / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_") and ("Published" in text or "best published" in text)
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={recipe}", "data.root=/data"])
    GlobalHydra.instance().clear()
    assert cfg.trainer.epochs >= 5 and cfg.model.name.startswith("resnet")
    if "ffcv" in recipe:
        assert cfg.data.progressive.enabled and cfg.scheduler.name == "linear" and cfg.trainer.label_smoothing == 0.1


@pytest.mark.parametrize("recipe", ["imagenette_128_5ep", "imagenette_128_20ep"])
def test_a_model_chosen_on_the_command_line_replaces_the_recipes(recipe):
    """The Imagenette recipes' network is a model option (xse_resnext50): `model=resnet18` trains a
    ResNet-18, where the recipe's own model keys used to win over the user's choice, silently."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        own = compose("config", overrides=[f"+experiment={recipe}", "data.root=/data"])
        chosen = compose("config", overrides=[f"+experiment={recipe}", "model=resnet18", "data.root=/data"])
    GlobalHydra.instance().clear()
    assert own.model.name == "resnetblur50d" and own.model.kwargs.cardinality == 32 and own.model.weight_init == "fan_in"
    assert chosen.model.name == "resnet18" and not chosen.model.kwargs and chosen.model.weight_init == "timm"


# In-process (run(cfg) on the composed recipe; no subprocess's imports), one test per recipe so the
# xdist workers share them: the recipe's own model, optimizer, schedule and loader, only made small.
SHRINK = [
    "trainer.device=cpu",
    "data.train_size=32",
    "data.val_resize=36",
    "data.val_size=32",
    "data.progressive.start_size=32",
    "data.progressive.end_size=32",
    "loader.batch_size=8",
    "loader.num_threads=2",
    "trainer.max_steps_per_epoch=1",
    "trainer.max_val_steps=1",
    "data.verify_files=false",  # the pre-flight check is tested elsewhere
    "trainer.epochs_per_job=1",
]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_one_step_on_the_sample_set(recipe, sample_root, tmp_path):
    run = run_inprocess([f"+experiment={recipe}", *SHRINK, f"data.root={sample_root}"], tmp_path / "run")
    summary = run.summary
    assert summary["val_samples"] == 8 and summary["train_img_s"] > 0 and summary["end_state"] == "job done"
