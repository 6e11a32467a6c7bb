"""Timed windows of training (or loading) steps, as scripts/benchmark.py measures them: the median
of several windows after a warm-up, none containing an epoch switch (the pipeline rebuild it costs
is kept apart), and a window under torch.profiler, run apart from the timed ones."""

from __future__ import annotations

import collections
import itertools
import statistics
import time
from pathlib import Path

import torch


class Endless:
    """Batches across epoch boundaries. Each boundary builds the next epoch's pipeline, as in
    training; the time that takes is kept in `switch_s`. `left` counts the batches left in the
    current epoch (None before the first), so that timed windows can stay inside one epoch."""

    def __init__(self, loader, hold: int = 0) -> None:
        self.loader, self.switch_s = loader, []
        self.left: int | None = None
        self._pass = None  # the loader's current pass, closed explicitly by close()
        self._batches = self._generate()
        self._held = collections.deque(maxlen=hold) if hold else None

    def _generate(self):
        for epoch in itertools.count():
            t = time.perf_counter()
            self.loader.set_epoch(epoch)
            self.switch_s.append(time.perf_counter() - t)
            self.left = len(self.loader)
            self._pass = iter(self.loader)
            for batch in self._pass:
                self.left -= 1
                yield batch

    def fits(self, steps: int) -> bool:
        """Whether the next `steps` batches come from the current epoch (or a fresh one)."""
        return self.left is None or self.left >= steps

    def drain(self) -> None:
        """Skip the rest of this epoch, so the next batch starts a new one."""
        for _ in range(self.left or 0):
            next(self._batches)

    def __next__(self):
        batch = next(self._batches)
        if self._held is not None:
            self._held.append(batch)
        return batch

    def __iter__(self):
        return self

    def close(self) -> None:
        """End the loader's pass now, which shuts a DALI pipeline down (its threads and GPU memory).
        The pass is closed by name: on Python 3.12 (the H200 host's) closing a generator does not
        finalize the one its `for` was iterating, so the pass and its pipeline lived until gc."""
        if self._pass is not None:
            self._pass.close()
        self._batches.close()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PROFILE_STEPS = 20  # batches in a --profile window


def profile_window(batches, work, *, device, steps: int, out: Path, name: str) -> None:
    """torch.profiler over `steps` batches: the ops/kernels by device time, a gzipped Chrome trace,
    and `profile_summary.summarize` of it (per-stream busy time: CUPTI sees the whole process, so
    DALI's kernels show up next to the model's). Host waits for batches are `data wait` ranges."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile, record_function

    from dali_train.profiling import load_events, summarize

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function("data wait"):
                images, labels = next(batches)
            work(images, labels)
        sync(device)
    out.mkdir(parents=True, exist_ok=True)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40)
    trace = out / f"trace_{name}.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    summary = summarize(load_events(Path(f"{trace}.gz")))
    (out / f"profile_{name}.txt").write_text(summary + "\n\n" + table)
    print(f"profile {name}:\n{summary}", flush=True)


def profiled_window(batches: Endless, work, *, device, warmup: int, out: Path, name: str) -> None:
    """`warmup` batches of a fresh loader, then `profile_window` over PROFILE_STEPS batches of the
    same epoch (the caller checks that one holds warmup + PROFILE_STEPS). Only after
    every timed window of the process: once the profiler has run, CUPTI can stay attached and make
    each CUDA launch cost more (pytorch/pytorch#144455); in one A/B on an H200, a ResNet-18 e2e row
    timed after a profiled row measured 81.0% of model-only, against 93.2% without a profile."""
    for _ in range(warmup):
        work(*next(batches))
    sync(device)
    switches = len(batches.switch_s)
    profile_window(batches, work, device=device, steps=PROFILE_STEPS, out=out, name=name)
    assert len(batches.switch_s) == switches, "the profile crossed an epoch switch (benchmark.py checks the length)"


def timed_windows(batches: Endless, work, *, device, batch_size, world_size, steps, warmup, repeats) -> dict:
    """Run `work(images, labels)` per batch; time `repeats` windows of `steps` after `warmup`. A
    window that would cross an epoch's end starts after it instead, warmed up again. Rates count
    all ranks."""

    def warm_up() -> None:
        for _ in range(warmup):
            work(*next(batches))
        sync(device)

    def align(n: int) -> None:
        if not batches.fits(n):
            batches.drain()
            warm_up()

    warm_up()
    rates, waits = [], []
    for _ in range(repeats):
        align(steps)
        switches = len(batches.switch_s)
        wait, start = 0.0, time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            images, labels = next(batches)
            wait += time.perf_counter() - t
            work(images, labels)
        sync(device)
        assert len(batches.switch_s) == switches, "a timed window crossed an epoch switch"
        elapsed = time.perf_counter() - start
        rates.append(steps * batch_size * world_size / elapsed)
        waits.append(wait / elapsed)
    return {
        "img_s": statistics.median(rates),
        "img_s_all": rates,
        "data_wait_frac": statistics.median(waits),
        "epoch_switches": len(batches.switch_s) - 1,  # during warm-up and drains, never in a window
    }


def build_timing(loader) -> dict:
    """Median DALI pipeline build and first-batch seconds of the train loader (what an epoch switch costs)."""
    times = getattr(loader, "build_times", [])
    if not times:
        return {}
    return {"build_s": statistics.median(b for b, _ in times), "first_batch_s": statistics.median(f for _, f in times)}
