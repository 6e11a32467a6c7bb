"""One-line errors of composition (dali_train/config_errors.py): from Hydra's and OmegaConf's
real exceptions, and as train.py prints them."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dali_train.config import register_configs
from dali_train.config_errors import check_experiment_choice, composition_error_line, require_values
from dali_train.errors import UserError
from tests.conftest import REPO, run_script


@pytest.fixture
def hydra_conf():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def composition_error(overrides: list[str]) -> ConfigCompositionException:
    with pytest.raises(ConfigCompositionException) as e:
        compose("config", overrides=overrides)
    return e.value


def test_a_key_of_another_option_is_its_key_and_omegaconfs_first_line(hydra_conf):
    line = composition_error_line(composition_error(["loader=pytorch", "loader.num_threads=3"]))
    assert line == "loader.num_threads: Key 'num_threads' not in 'PytorchLoaderConfig'", line


def test_an_unknown_option_lists_the_options_on_one_line_without_the_schemas(hydra_conf):
    """Hydra's message spans lines (the failure, "Available options in 'loader':", one option per
    line, the search path); the schemas are options of the group to Hydra, never to users."""
    error = composition_error(["loader=nosuch"])
    assert "\n" in str(error)
    line = composition_error_line(error)
    assert "\n" not in line and "nosuch" in line, line
    assert "Available options in 'loader': dali, dali_cpu, pytorch, synthetic" in line, line
    assert "_schema" not in line and "Config search path" not in line, line


def test_a_required_value_nobody_set_is_named(hydra_conf):
    with pytest.raises(UserError, match=r"^data\.root: no value; set it on the command line \(data\.root=\.\.\.\)$"):
        require_values(compose("config", overrides=["data=imagenet"]))
    require_values(compose("config", overrides=["data=imagenet", "data.root=/somewhere"]))  # set: no error


def test_an_unresolvable_interpolation_found_while_looking_for_missing_values_is_one_line():
    cfg = OmegaConf.create({"optimizer": {"lr": "${optimizer.nope}"}})
    with pytest.raises(UserError, match=r"^optimizer\.lr: Interpolation key 'optimizer\.nope' not found$"):
        require_values(cfg)


def test_a_recipe_or_no_experiment_is_not_refused():
    check_experiment_choice(None)
    check_experiment_choice("imagenette_128_5ep")


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.root=${oc.env:DALI_TRAIN_TEST_UNSET}", "data.root: KeyError raised while resolving interpolation"),
        ("optimizer.lr=${optimizer.nope}", "optimizer.lr: Interpolation key 'optimizer.nope' not found"),
    ],
)
def test_an_interpolation_that_does_not_resolve_is_one_line(tmp_path, capfd, override, message):
    """Finding the `???` keys resolves every value: an unset variable was a traceback, exit 1."""
    proc = run_script("train.py", override, f"hydra.run.dir={tmp_path}", capfd=capfd, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines



def test_a_part_that_recipes_share_is_refused_as_a_recipe(tmp_path, capfd):
    """conf/experiment/base/ holds what the FFCV ResNet-50 recipes share; alone it would train with
    the schema's epochs and ramp. The error names the recipes that use it."""
    proc = run_script(
        "train.py", "+experiment=base/imagenet_rn50_ffcv", f"hydra.run.dir={tmp_path}", capfd=capfd, check=False
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: experiment=base/imagenet_rn50_ffcv: a part that recipes"), lines
    assert "+experiment=imagenet_rn50_ffcv_16ep" in lines[0] and "+experiment=imagenet_rn50_ffcv_88ep" in lines[0]
    assert "+experiment=imagenet_rn50_90ep" not in lines[0]
    assert not (tmp_path / "checkpoints").exists()
