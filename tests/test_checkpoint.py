"""Checkpoint files and weights loading in-process: what is saved loads with weights_only=True, a
crafted pickle never runs, pretrained weights are strict by default, the schedule length is ceil."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from dali_train.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointMeta,
    read_checkpoint,
    restore_rng,
    rng_state,
    save_durably,
)
from dali_train.distributed import DistInfo
from dali_train.ending import RunShape, ending_for
from dali_train.engine import updates_per_epoch
from dali_train.errors import UserError
from dali_train.models import ModelError, load_pretrained


class RunsShell:
    """Unpickling this runs `touch marker`: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def crafted_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"format_version": 2, "model": {"w": torch.zeros(1)}, "payload": RunsShell(marker)}, path)
    return path


def test_the_crafted_file_does_run_code_when_unpickled_unsafely(tmp_path):
    """The planted file is a real exploit (so the tests that refuse it can fail): unpickled as a
    full pickle, it runs its shell command (os.system, named in the file; nothing of this module's)."""
    marker = tmp_path / "MARKER"
    path = crafted_checkpoint(tmp_path / "evil.pt", marker)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_crafted_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "MARKER"
    path = crafted_checkpoint(tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError, match=r"trainer.resume=.*evil.pt: not a checkpoint readable without running"):
        read_checkpoint(path)
    with pytest.raises(ModelError, match=r"model.pretrained=.*evil.pt: not a weights file readable"):
        load_pretrained(timm.create_model("test_resnet", num_classes=10), str(path))
    assert not marker.exists()


def test_random_bytes_as_pretrained_is_one_line(tmp_path):
    path = tmp_path / "random.pt"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(UserError) as err:
        load_pretrained(timm.create_model("test_resnet", num_classes=10), str(path))
    assert "\n" not in str(err.value) and f"model.pretrained={path}" in str(err.value)


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # a cached Gaussian is part of numpy's state
    torch.save({"rng": [rng_state()]}, tmp_path / "rng.pt")
    expected = (random.random(), np.random.normal(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"][0])
    assert random.random() == expected[0] and np.random.normal() == expected[1]
    assert torch.equal(torch.rand(3), expected[2])


def test_a_saved_training_state_loads_with_weights_only(tmp_path):
    """Model, EMA, optimizer with its state, scaler and the run config: no pickled objects."""
    from types import SimpleNamespace

    from timm.utils import ModelEmaV3

    model = timm.create_model("test_resnet", num_classes=10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.9, 0.99))
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    parts = SimpleNamespace(
        model=model, ema=ModelEmaV3(model), optimizer=optimizer, scaler=torch.amp.GradScaler("cpu"), global_step=1
    )
    meta = CheckpointMeta("test_resnet", "adamw", 8, 1, 1, 3, config={"optimizer": {"betas": [0.9, 0.99]}})
    Checkpointer(tmp_path, DistInfo(0, 0, 1), meta).save("last.pt", parts, next_epoch=1, next_step=0, best_top1=-1.0)
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert state["optimizer"]["state"] and state["model_ema"] and state["config"]["optimizer"]["betas"] == [0.9, 0.99]
    assert not list((tmp_path / "checkpoints").glob(".*.tmp-*"))


def test_pretrained_of_another_architecture_is_strict_by_default(tmp_path):
    """resnet18 weights into resnet34: an error with counts; pretrained_strict=false loads what fits."""
    torch.save(timm.create_model("resnet18", num_classes=10).state_dict(), tmp_path / "r18.pt")
    r34 = timm.create_model("resnet34", num_classes=10)
    with pytest.raises(
        ModelError, match=r"96 of 218 tensors .* missing or differ.*pretrained_strict=false.* 122 that fit"
    ):
        load_pretrained(r34, str(tmp_path / "r18.pt"))
    before = r34.layer4[0].conv1.weight.clone()
    load_pretrained(r34, str(tmp_path / "r18.pt"), strict=False)
    assert not torch.equal(r34.layer4[0].conv1.weight, before)  # a fitting tensor was loaded


def test_pretrained_from_our_checkpoint_takes_its_ema_weights(tmp_path, caplog):
    """best.pt is chosen on EMA accuracy, so its EMA weights are the ones to start from; a
    classifier of another class count stays fresh under the strict default."""
    model, ema = timm.create_model("test_resnet", num_classes=10), timm.create_model("test_resnet", num_classes=10)
    torch.save({"model": model.state_dict(), "model_ema": ema.state_dict()}, tmp_path / "best.pt")
    fresh = timm.create_model("test_resnet", num_classes=5)
    with caplog.at_level("INFO"):
        load_pretrained(fresh, str(tmp_path / "best.pt"))
    assert torch.equal(fresh.conv1[0].weight, ema.conv1[0].weight)
    assert not torch.equal(fresh.conv1[0].weight, model.conv1[0].weight)
    assert "(EMA weights)" in caplog.text and "classifier fc left at its fresh initialization" in caplog.text


def test_updates_per_epoch_counts_the_last_partial_accumulation():
    """The loop updates on the epoch's last micro-step too: 25 steps at accumulation 2 are 13 updates."""
    assert updates_per_epoch(25, None, 2) == 13
    assert updates_per_epoch(25, 4, 2) == 2  # trainer.max_steps_per_epoch caps the epoch
    assert updates_per_epoch(24, None, 2) == 12 and updates_per_epoch(1, None, 4) == 1


def test_a_checkpoint_is_synced_to_disk_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    """Without a sync, a machine crash could keep the rename but not the data: an empty last.pt in
    place of the previous one, which every requeue then failed to read."""
    synced, real_fsync = [], os.fsync

    def fsync(fd: int) -> None:  # the real fsync, recording what it synced
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    tmp, path = tmp_path / ".last.pt.tmp-1", tmp_path / "last.pt"
    save_durably({"x": torch.ones(3)}, tmp, path)
    assert synced == [str(tmp), str(tmp_path)] and not tmp.exists()
    assert read_checkpoint(path)["x"].sum() == 3


def small_training_state():
    from types import SimpleNamespace

    model = timm.create_model("test_resnet", num_classes=10)
    parts = SimpleNamespace(model=model, ema=None, optimizer=torch.optim.SGD(model.parameters()), scaler=None, global_step=1)
    return parts, CheckpointMeta("test_resnet", "sgd", 8, 1, 1, 3)


def save_ending(checkpointer: Checkpointer, parts) -> tuple[str, str]:
    """(end_state, message) of the run a failed save would end."""
    with pytest.raises(CheckpointError) as failed:
        checkpointer.save("last.pt", parts, next_epoch=1, next_step=0, best_top1=-1.0)
    ending = ending_for(failed.value, RunShape("test_resnet", 8, 1, None), 1800, training=True)
    return ending.state, ending.message


def test_a_checkpoint_write_that_runs_out_of_room_ends_disk_full_and_another_failure_does_not(tmp_path):
    """torch's writer reports any failed write as "unexpected pos", no errno: every failure ended the
    run "disk full". The errno behind it decides. The temp file is a link: to /dev/full (every write
    fails with ENOSPC), then into a folder that does not exist (ENOENT)."""
    parts, meta = small_training_state()
    checkpointer = Checkpointer(tmp_path, DistInfo(0, 0, 1), meta)
    checkpointer.dir.mkdir()
    tmp = checkpointer.dir / f".last.pt.tmp-{os.getpid()}"
    tmp.symlink_to("/dev/full")
    state, message = save_ending(checkpointer, parts)
    assert state == "disk full" and "No space left on device" in message, message
    tmp.symlink_to(tmp_path / "gone" / "last.pt")
    state, message = save_ending(checkpointer, parts)
    assert state == "error" and "No such file or directory" in message, message
    assert "there is no earlier last.pt" in message and not tmp.is_symlink()


def test_an_empty_checkpoint_is_one_line_naming_the_other_one(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"")
    with pytest.raises(UserError) as err:
        read_checkpoint(path)
    assert "\n" not in str(err.value) and "empty file" in str(err.value) and "best.pt" in str(err.value)
