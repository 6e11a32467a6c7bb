"""dali_train.model_inputs: a model that takes one image side only is checked against every side the
run will feed it, and progressive resizing's largest crop against the GPU's memory, at startup, not
at the first validation or progressive-resize epoch."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import socket

import pytest
import timm
import torch

from dali_train.config import DataConfig, ProgressiveConfig
from dali_train.distributed import DistInfo
from dali_train.engine import TrainParts
from dali_train.errors import OutOfMemory
from dali_train.model_inputs import check_input_sides, check_largest_crop_fits, fixed_input_side, run_input_sides
from dali_train.models import ModelError
from dali_train.run_dirs import holds_a_run
from tests.conftest import TINY, exit_code, read_json, run_inprocess
from tests.helpers import oom_model


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


def _parts(model: torch.nn.Module) -> TrainParts:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainParts(model, optimizer, None, torch.nn.functional.cross_entropy, torch.device("cpu"), DistInfo(0, 0, 1))


RAMP_32_TO_48 = ProgressiveConfig(enabled=True, start_size=32, end_size=48, start_epoch=0, end_epoch=2, step=8)


def test_the_largest_crop_check_trains_nothing():
    """One forward and backward at the ramp's largest side, and no trace of it: BatchNorm statistics,
    gradients, RNG stream and eval mode as before, the weights untouched."""
    model = timm.create_model("test_resnet", num_classes=10, drop_rate=0.5).eval()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append((tuple(args[0].shape), module.training)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    data = DataConfig(name="x", root="/x", progressive=RAMP_32_TO_48)
    check_largest_crop_fits(_parts(model), "test_resnet", data, epochs=4, start_epoch=0, batch_size=4,
                            channels_last=False, compiled=False)  # fmt: skip
    assert seen == [((4, 3, 48, 48), True)]  # it ran, in train mode, at the largest side
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and not model.training
    assert torch.equal(torch.get_rng_state(), rng)
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(timm.create_model("test_resnet", num_classes=10))
    check_largest_crop_fits(_parts(synced), "test_resnet", data, epochs=4, start_epoch=0, batch_size=4,
                            channels_last=False, compiled=False)  # fmt: skip
    assert all("forward" not in m.__dict__ for m in synced.modules())  # SyncBatchNorm's own forward is back
    seen.clear()  # resumed past the ramp's growth, or without a ramp: the next step is the check
    check_largest_crop_fits(_parts(model), "test_resnet", data, epochs=4, start_epoch=2, batch_size=4,
                            channels_last=False, compiled=False)  # fmt: skip
    check_largest_crop_fits(_parts(model), "test_resnet", DataConfig(name="x", root="/x"), epochs=4, start_epoch=0,
                            batch_size=4, channels_last=False, compiled=False)  # fmt: skip
    assert seen == []


def test_a_compiled_model_whose_eager_self_runs_out_at_the_largest_crop_gets_a_warning(caplog):
    """Compiling saves activation memory: its eager self running out is no proof, so no refusal."""
    model = timm.create_model(oom_model.ABOVE_40PX_NAME, num_classes=10)
    data = DataConfig(name="x", root="/x", progressive=RAMP_32_TO_48)
    with caplog.at_level(logging.WARNING, logger="dali_train.model_inputs"):
        check_largest_crop_fits(_parts(model), "m", data, epochs=4, start_epoch=0, batch_size=4,
                                channels_last=False, compiled=True)  # fmt: skip
    assert len(caplog.messages) == 1 and "48x48 px (epoch 2)" in caplog.messages[0], caplog.messages
    assert "compiled one may fit" in caplog.messages[0]


def test_a_ramp_whose_largest_crop_runs_out_of_memory_stops_at_startup(small_root, tmp_path):
    """The first epochs' 32 px fit and the ramp's 48 px would not: one line before any training,
    not an out-of-memory error at epoch 2 (a real one needs a GPU: the model raises torch's)."""
    run = tmp_path / "run"
    ramp = ["data.progressive.enabled=true", "data.progressive.start_size=32", "data.progressive.end_size=48",
            "data.progressive.step=8", "data.progressive.end_epoch=2", "trainer.epochs=3"]  # fmt: skip
    args = [*TINY, f"data.root={small_root}", f"model.name={oom_model.ABOVE_40PX_NAME}", *ramp]
    ended = run_inprocess(args, run, check=False).ended
    assert exit_code(ended) == 2 and "\n" not in str(ended), ended
    for text in ("data.progressive", "48x48 px (epoch 2)", "loader.batch_size=16", "data.progressive.end_size"):
        assert text in str(ended), ended
    summary = read_json(run / "summary.json")
    assert summary["end_state"] == "out of memory" and summary.get("epochs_completed", 0) == 0, summary
    assert not list(run.glob("**/*.pt")) and not holds_a_run(run)  # its corrected rerun may go into this dir
    # a ramp that stays within what fits trains
    fits = run_inprocess([*args, "data.progressive.end_size=40", "trainer.max_steps_per_epoch=2"], tmp_path / "fits")
    assert fits.summary["end_state"] == "completed", fits.summary


def _check_on_rank(rank: int, port: int, results) -> None:
    """Rank 1's model runs out of memory at 48 px, rank 0's fits; both run the check in one gloo group."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    name = oom_model.ABOVE_40PX_NAME if rank == 1 else "test_resnet"
    data = DataConfig(name="x", root="/x", progressive=RAMP_32_TO_48)
    parts = dataclasses.replace(_parts(timm.create_model(name, num_classes=10)), dist=DistInfo(rank, rank, 2))
    try:
        check_largest_crop_fits(parts, name, data, epochs=4, start_epoch=0, batch_size=4, channels_last=False,
                                compiled=False)  # fmt: skip
        results.put((rank, "fits"))
    except OutOfMemory as e:
        results.put((rank, str(e)))
    finally:
        torch.distributed.destroy_process_group()


def test_one_rank_running_out_at_the_largest_crop_stops_every_rank():
    """Two real processes in a gloo group: rank 0 fits, rank 1 does not; both stop at startup
    (rank 0 going on would wait in its first collective for a rank that had ended)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    ranks = [spawn.Process(target=_check_on_rank, args=(rank, port, results)) for rank in (0, 1)]
    for p in ranks:
        p.start()
    outcomes = dict(results.get(timeout=120) for _ in ranks)
    for p in ranks:
        p.join(timeout=60)
    assert sorted(outcomes) == [0, 1] and all("48x48 px (epoch 2)" in o for o in outcomes.values()), outcomes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_ramp_to_a_crop_past_the_gpus_memory_stops_at_startup_on_the_gpu(small_root, tmp_path):
    """A real out-of-memory error: ResNet-50, 256 images of 2048 px (the first epoch's 32 px fit)."""
    gpu = [o.replace("trainer.device=cpu", "trainer.device=cuda") for o in TINY] + ["trainer.amp=bf16"]
    ramp = ["data.progressive.enabled=true", "data.progressive.start_size=32", "data.progressive.step=32",
            "data.progressive.end_epoch=1", "trainer.epochs=2", "loader=dali", f"data.root={small_root}"]  # fmt: skip
    args = [*gpu, *ramp, "model.name=resnet50", "loader.batch_size=256", "data.progressive.end_size=2048"]
    ended = run_inprocess(args, tmp_path / "run", check=False).ended
    assert exit_code(ended) == 2 and "2048x2048 px (epoch 1)" in str(ended), ended
    fits = run_inprocess([*gpu, *ramp, "data.progressive.end_size=64", "trainer.max_steps_per_epoch=3"], tmp_path / "fits")
    assert fits.summary["end_state"] == "completed", fits.summary
