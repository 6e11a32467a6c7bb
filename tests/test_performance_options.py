"""The performance options: CUDA hardware queues set before CUDA starts, and torch.compile modes."""

from __future__ import annotations

import copy

import pytest
import torch
from timm.scheduler import CosineLRScheduler

from dali_train.distributed import DistInfo
from dali_train.engine import TrainParts, train_step
from dali_train.models import wrap_for_training
from tests.conftest import TINY, exit_code, run_inprocess

ONE_STEP = ["trainer.epochs=1", "trainer.max_steps_per_epoch=1", "trainer.max_val_steps=1"]


def test_train_py_sets_cuda_max_connections_unless_the_user_did(sample_root, tmp_path, monkeypatch):
    run = tmp_path / "default"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "")  # empty counts as unset
    run_inprocess([*TINY, *ONE_STEP, f"data.root={sample_root}"], run)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in (run / "train.log").read_text()
    # The user's own value wins; and a bad compile mode is a one-line error (exit 2) before any work.
    run = tmp_path / "user"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "4")
    ended = run_inprocess([*TINY, f"data.root={sample_root}", "trainer.compile_mode=fast"], run, check=False)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=4" in (run / "train.log").read_text()
    assert exit_code(ended.ended) == 2 and "\n" not in str(ended.ended), ended.log[-2000:]
    assert "trainer.compile_mode=fast: unknown; choose one of default, reduce-overhead" in str(ended.ended)


def _parts(compile_mode: str | None) -> TrainParts:
    """A tiny conv net with EMA, SGD, a per-step schedule and 2 micro-batches per update."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 4),
    )  # fmt: skip
    device = torch.device("cpu")
    model, ema = wrap_for_training(
        net,
        device,
        DistInfo(0, 0, 1),
        channels_last=False,
        sync_bn=False,
        ema_decay=0.5,
        compile=compile_mode is not None,
        compile_mode=compile_mode or "default",
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = CosineLRScheduler(optimizer, t_initial=4, warmup_t=1, warmup_lr_init=0.01, t_in_epochs=False)
    return TrainParts(
        model, optimizer, scheduler, torch.nn.CrossEntropyLoss(), device, DistInfo(0, 0, 1), ema=ema, grad_accum_steps=2
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])  # CUDA graphs are skipped on CPU: the path runs
def test_compiled_training_matches_eager_with_ema_and_grad_accumulation(mode):
    """Batches come from one reused buffer, as DALI's outputs do; the losses are kept across steps."""
    eager, compiled = _parts(None), _parts(mode)
    buffer = torch.empty(4, 3, 12, 12)
    generator = torch.Generator().manual_seed(1)
    results = {}
    for name, parts in (("eager", eager), ("compiled", compiled)):
        generator.manual_seed(1)
        losses = []
        for step in range(1, 5):  # 4 micro-batches = 2 optimizer steps
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
            labels = torch.randint(0, 4, (4,), generator=generator)
            losses.append(train_step(parts, buffer, labels, update=step % 2 == 0).detach())
        results[name] = torch.stack(losses)
    torch.testing.assert_close(results["compiled"], results["eager"], rtol=1e-4, atol=1e-5)
    assert compiled.global_step == 2 and compiled.optimizer.param_groups[0]["lr"] == eager.optimizer.param_groups[0]["lr"]
    eager_ema = copy.deepcopy(eager.ema.module.state_dict())
    for key, value in compiled.ema.module.state_dict().items():
        torch.testing.assert_close(value, eager_ema[key], rtol=1e-4, atol=1e-5)
