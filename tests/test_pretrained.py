"""model.pretrained end to end: an evaluation of it (trainer.eval_only) is checked as a resumed
checkpoint is, instead of reporting the top-1 of another network or of a random classifier; a
resumed run does not read it (the checkpoint's weights replace it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from tests.conftest import TINY, read_json, run_inprocess
from tests.test_resume import assert_one_line_ending


def args(root: Path, *extra: str) -> list[str]:
    return [*TINY, f"data.root={root}", "loader.batch_size=8", "trainer.max_steps_per_epoch=2", *extra]


@pytest.fixture(scope="module")
def mish_run(small_root, tmp_path_factory) -> Path:
    """Two steps of test_resnet with Mish activations (model.kwargs.act_layer=mish), validated."""
    run = tmp_path_factory.mktemp("mish") / "run"
    run_inprocess(args(small_root, "trainer.epochs=1", "++model.kwargs.act_layer=mish"), run)
    return run


def test_an_evaluation_of_our_checkpoint_built_as_another_network_is_one_line(small_root, mish_run, tmp_path):
    """Without its act_layer every shape still fits: the evaluation reported another network's top-1
    (51 vs 81 in the audit) and exited 0. Built as trained, it is the training run's val loss."""
    last = mish_run / "checkpoints" / "last.pt"
    evaluate = args(small_root, "trainer.eval_only=true", f"model.pretrained={last}")
    ended = run_inprocess(evaluate, tmp_path / "relu", check=False)
    assert_one_line_ending(ended, "model.kwargs={}", "model.kwargs={'act_layer': 'mish'}", "another network")
    same = run_inprocess([*evaluate, "++model.kwargs.act_layer=mish"], tmp_path / "mish")
    assert same.summary["val_loss"] == pytest.approx(read_json(mish_run / "summary.json")["val_loss"], rel=1e-5)


def test_an_evaluation_of_weights_of_another_class_count_is_one_line(small_root, tmp_path):
    """Fine-tuning keeps a fresh classifier for another class count; an evaluation reported that
    random head's top-1 and exited 0."""
    five = tmp_path / "five.pt"
    torch.save(timm.create_model("test_resnet", num_classes=5).state_dict(), five)
    ended = run_inprocess(args(small_root, "trainer.eval_only=true", f"model.pretrained={five}"), tmp_path / "run", check=False)
    assert_one_line_ending(ended, f"model.pretrained={five}", "fresh initialization", "another class count")


def test_an_evaluation_that_leaves_tensors_of_the_file_unused_is_one_line(small_root, tmp_path):
    """A layer this model lacks (a self-attention layer, say): with model.pretrained_strict=false, which
    the strict error suggests, the evaluation scored the network without it and exited 0."""
    more = tmp_path / "more.pt"
    state = timm.create_model("test_resnet", num_classes=10).state_dict()
    torch.save({**state, "attention.query.weight": torch.zeros(4, 4)}, more)
    evaluate = args(small_root, "trainer.eval_only=true", f"model.pretrained={more}", "model.pretrained_strict=false")
    ended = run_inprocess(evaluate, tmp_path / "run", check=False)
    assert_one_line_ending(ended, f"model.pretrained={more}", "1 tensors of the file unused", "attention.query.weight")


def test_a_resumed_job_does_not_need_the_pretrained_file(small_root, tmp_path):
    """A requeued job restores its last.pt, whose weights replace the pretrained ones: it failed
    once that file was gone ("model.pretrained=...: no such file"), a scratch file moved or deleted."""
    start = tmp_path / "start.pt"
    torch.save(timm.create_model("test_resnet", num_classes=10).state_dict(), start)
    run, job = tmp_path / "run", args(small_root, f"model.pretrained={start}", "trainer.epochs=2", "trainer.epochs_per_job=1")
    assert run_inprocess(job, run).summary["end_state"] == "job done"
    start.unlink()
    resumed = run_inprocess([*job, "trainer.resume=auto"], run)
    assert resumed.summary["end_state"] == "completed" and resumed.summary["epochs_completed"] == 2
    assert f"model.pretrained={start} not loaded" in resumed.log
