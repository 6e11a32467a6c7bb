"""The training loop in-process on a tiny model: the fp16 GradScaler with clipping, gradient
accumulation windows, max_steps with a resume, mid-epoch checkpoint positions
(trainer.save_every_n_steps)."""

from __future__ import annotations

import copy
import json
import signal
import time

import pytest
import torch
import torch.distributed as torch_dist
from timm.scheduler import CosineLRScheduler

from dali_train.distributed import DistInfo, StopFlag
from dali_train.engine import LoopControl, TrainParts, train_one_epoch, train_step
from dali_train.logs import MetricsWriter

LR = 0.5


def parts_for(model: torch.nn.Module, **kwargs) -> TrainParts:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)  # no momentum: an update is -lr × gradient
    scheduler = CosineLRScheduler(optimizer, t_initial=100, t_in_epochs=False)  # LR stays LR at the first step
    cpu = torch.device("cpu")
    return TrainParts(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loss_fn=torch.nn.CrossEntropyLoss(),
        device=cpu,
        dist=DistInfo(0, 0, 1),
        **kwargs,
    )


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=gen) * 10, torch.randint(0, 3, (4,), generator=gen)) for _ in range(n)]


def test_fp16_grad_scaler_unscales_before_clipping():
    """trainer.amp=fp16 with trainer.clip_grad_norm: the norm is clipped on the true gradients
    (unscaled first), so the update is -lr × gradient × clip/‖gradient‖, whatever the loss scale.
    A real GradScaler on CPU (the app turns AMP off on CPU; this branch is the engine's)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    (images, labels) = batches(1)[0]
    reference = copy.deepcopy(model)
    torch.nn.functional.cross_entropy(reference(images), labels).backward()
    grads = [p.grad for p in reference.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    clip = norm.item() / 4  # clipping is active
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    parts = parts_for(model, scaler=scaler, clip_grad_norm=clip)
    before = [p.detach().clone() for p in model.parameters()]
    train_step(parts, images, labels, update=True)
    for old, new, grad in zip(before, model.parameters(), grads, strict=True):
        torch.testing.assert_close(old - new.detach(), LR * grad * clip / norm, rtol=1e-4, atol=1e-6)
    assert scaler.get_scale() == 2.0**12 and parts.global_step == 1  # a finite step: not skipped


@pytest.mark.parametrize("accum", [1, 2])
def test_save_every_n_steps_saves_at_every_nth_update_with_the_micro_step_to_resume_at(tmp_path, accum):
    """9 batches resumed at micro-step 4 of epoch 3: a save every 2 updates, never on the epoch's
    last step (the end-of-epoch save follows); the position is the next micro-step to train."""
    model = torch.nn.Linear(8, 3)
    parts = parts_for(model, grad_accum_steps=accum)
    saved = []
    ctl = LoopControl(
        MetricsWriter(tmp_path, False),
        log_every=100,
        save_every=2,
        save=lambda epoch, step: saved.append((epoch, step, parts.global_step)),
    )
    train_one_epoch(parts, batches(9), ctl, epoch=3, start_step=4)
    if accum == 1:  # updates after micro-steps 1..9; saves after updates 2, 4, 6, 8
        assert saved == [(3, 6, 2), (3, 8, 4), (3, 10, 6), (3, 12, 8)]
    else:  # updates after micro-steps 2, 4, 6, 8 and 9 (the epoch's last, partial group)
        assert saved == [(3, 8, 2), (3, 12, 4)]
    assert parts.global_step == (9 if accum == 1 else 5)


def test_max_steps_caps_the_whole_epoch_when_it_resumes_mid_epoch(tmp_path):
    """trainer.max_steps_per_epoch=5 and a resume at micro-step 2: 3 more steps, not 5 (a loader's
    length is what is left of its epoch, as the real loaders report after set_epoch(e, start_step))."""
    parts = parts_for(torch.nn.Linear(8, 3))
    left = batches(9)[2:]
    ctl = LoopControl(MetricsWriter(tmp_path, False), log_every=100, max_steps=5)
    stats = train_one_epoch(parts, left, ctl, epoch=0, start_step=2)
    assert stats.steps == 3 and parts.global_step == 3


def test_a_resumed_epoch_logs_on_the_batches_an_uninterrupted_one_logs(tmp_path):
    """log_every 4, resumed at batch 3: rows at batches 4 and 8 and the epoch's last, 12, as the
    uninterrupted epoch's (they fell on 7 and 11, the interval counted from the resume)."""
    parts = parts_for(torch.nn.Linear(8, 3))
    ctl = LoopControl(MetricsWriter(tmp_path, True), log_every=4)
    train_one_epoch(parts, batches(12)[3:], ctl, epoch=0, start_step=3)
    ctl.writer.close()
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in rows] == [4, 8, 12] and [r["step"] for r in rows] == [1, 5, 9]


def test_under_ddp_a_signal_stops_at_the_update_whose_window_holds_a_log_step(tmp_path):
    """Ranks agree on a stop at log steps. With accumulation 3 and log_every 4 the update after
    micro-step 6 holds log step 4: the stop comes there, not at lcm(3, 4) = 12 (this epoch's end,
    so never). One real gloo process stands for the ranks: the decision is still a collective."""
    torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    try:
        parts = parts_for(torch.nn.Linear(8, 3), grad_accum_steps=3)
        parts.dist = DistInfo(0, 0, 2)  # several ranks: the stop goes through all_reduce
        stop = StopFlag()
        stop.signal = signal.SIGTERM  # as the handler sets it, before the first step
        ctl = LoopControl(MetricsWriter(tmp_path, False), log_every=4, stop=stop)
        stats = train_one_epoch(parts, batches(12), ctl, epoch=0)
    finally:
        torch_dist.destroy_process_group()
    assert stats.interrupted and stats.steps == 6 and parts.global_step == 2


def test_a_slow_checkpoint_save_is_not_counted_as_waiting_for_data(tmp_path):
    parts = parts_for(torch.nn.Linear(8, 3))
    ctl = LoopControl(MetricsWriter(tmp_path, False), log_every=100, save_every=1, save=lambda e, s: time.sleep(0.2))
    stats = train_one_epoch(parts, batches(5), ctl, epoch=0)  # in memory: batches come at once
    assert stats.data_wait_frac < 0.2, stats.data_wait_frac  # was ~0.99: the saves counted as data wait


def test_each_update_is_the_mean_gradient_of_its_own_window_the_epochs_last_partial_one_too(tmp_path):
    """grad_accum_steps=2 over 3 batches: updates after batches 2 and 3; the second, a window of one
    batch, steps on that batch's own gradient (not half of it), as timm's train.py does."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    parts = parts_for(model, grad_accum_steps=2)
    data = batches(3)
    windows = [data[:2], data[2:]]
    pairs = []

    def compare(optimizer, args, kwargs) -> None:  # before each update: the gradient it will apply
        reference = copy.deepcopy(model)
        reference.zero_grad()
        window = windows[len(pairs)]
        torch.stack([torch.nn.functional.cross_entropy(reference(x), y) for x, y in window]).mean().backward()
        pairs.append([(p.grad.clone(), r.grad) for p, r in zip(model.parameters(), reference.parameters(), strict=True)])

    parts.optimizer.register_step_pre_hook(compare)
    train_one_epoch(parts, data, LoopControl(MetricsWriter(tmp_path, False), log_every=100), epoch=0)
    assert len(pairs) == 2 and parts.global_step == 2
    for update in pairs:
        for grad, expected in update:
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
