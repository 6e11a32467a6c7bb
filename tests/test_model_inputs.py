"""dali_train.model_inputs: a model that takes one image side only is checked against every side the
run will feed it, at startup, not at its first validation or progressive-resize epoch."""

from __future__ import annotations

import pytest
import timm

from dali_train.config import DataConfig, ProgressiveConfig
from dali_train.model_inputs import check_input_sides, fixed_input_side, run_input_sides
from dali_train.models import ModelError
from tests.conftest import TINY, exit_code, read_json, run_inprocess


def test_the_sides_a_run_feeds_include_every_progressive_step():
    data = DataConfig(name="x", root="/x", train_size=224, val_size=256)
    assert run_input_sides(data, epochs=3, eval_only=False) == {"data.val_size": 256, "data.train_size": 224}
    assert run_input_sides(data, epochs=3, eval_only=True) == {"data.val_size": 256}
    ramp = ProgressiveConfig(enabled=True, start_size=160, end_size=224, start_epoch=0, end_epoch=2, step=32)
    ramped = DataConfig(name="x", root="/x", val_size=224, progressive=ramp)
    sides = run_input_sides(ramped, epochs=4, eval_only=False)
    assert sides == {"data.val_size": 224, "data.progressive (epoch 0)": 160, "data.progressive (epoch 1)": 192}
    # loader=synthetic feeds data.train_size whatever data.progressive says
    assert run_input_sides(ramped, epochs=4, eval_only=False, progressive=False)["data.train_size"] == 224


def test_only_fixed_size_models_are_held_to_one_side():
    sides = {"data.train_size": 160, "data.val_size": 224}
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=10)
    assert fixed_input_side(vit) == (224, 224)
    with pytest.raises(ModelError, match=r"takes 224x224 px images only, not data.train_size=160: set them to 224"):
        check_input_sides(vit, "vit_tiny_patch16_224", sides)
    check_input_sides(timm.create_model("vit_tiny_patch16_224", num_classes=10, dynamic_img_size=True), "vit", sides)
    check_input_sides(timm.create_model("resnet18", num_classes=10), "resnet18", sides)
    check_input_sides(timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=160), "vit", {"a": 160})
    # a strict patch embedding behind a strided stem names another side: only the input's counts
    check_input_sides(timm.create_model("visformer_tiny", num_classes=10), "visformer_tiny", {"data.val_size": 224})
    mixer = timm.create_model("mixer_s16_224", num_classes=10)  # fixed at its stem; takes no dynamic_img_size
    with pytest.raises(ModelError, match=r"takes 224x224 px images only.*\(model.kwargs.img_size=N\)$"):
        check_input_sides(mixer, "mixer_s16_224", sides)


def test_a_run_that_would_validate_a_vit_off_its_side_stops_before_training(small_root, tmp_path):
    run = tmp_path / "run"
    args = [*TINY, f"data.root={small_root}", "model.name=vit_tiny_patch16_224", "data.train_size=224",
            "data.val_resize=256", "data.val_size=256"]  # fmt: skip
    ended = run_inprocess(args, run, check=False).ended
    assert exit_code(ended) == 2 and "\n" not in str(ended), ended  # main's one `error:` line
    assert "model.name=vit_tiny_patch16_224 takes 224x224 px images only, not data.val_size=256" in str(ended)
    assert read_json(run / "summary.json").get("epochs_completed", 0) == 0 and not (run / "checkpoints").exists()
