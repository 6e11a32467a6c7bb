#!/usr/bin/env python
"""Startup and epoch-switch cost at ImageNet scale, on a link farm of --entries train files.

Makes (once, kept at --root for reruns) --classes class folders with a few real JPEGs each, linked
to --entries train entries (ImageNet: 1.28M in 1,000 classes) and 50 val entries per class. Then
times what train.py does before its first step and at every epoch switch, with the app's config
(`loader=dali`, its defaults; everything after `--` is a Hydra override):
  listing            scan_dataset: the class folders' directory listing
  pre-flight check   find_bad_files: the header/trailer read of every entry, in threads
  first batch        train pipeline build over the whole list + its first batch (epoch 0)
  epoch switch       set_epoch(1): the next epoch's order, file list and pipeline build + first batch
  switch beside      set_epoch(2) on a thread (train.py's NextEpoch) while a Python loop runs in this
                     thread, as validation would: the loop time it lost against its pace beside a
                     thread that only sleeps (the GIL held or shared elsewhere, the cores shared), and
                     how long it stood still in gaps over STALL_S (beside the sleeper: the method's zero)
and the peak host memory of the process (ru_maxrss) after each.

    python scripts/measure_startup.py --root /tmp/farm-1.28M --json startup.json
    python scripts/measure_startup.py --root /tmp/farm --entries 20000 --classes 100 -- trainer.device=cpu
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir

from dali_train.cli import at_least
from dali_train.config import load_config, register_configs
from dali_train.data import NextEpoch, build_loaders
from dali_train.data.folder import scan_dataset
from dali_train.data.sample import link_copies, make_image_folder
from dali_train.data.sniff import find_bad_files
from dali_train.device import amp_dtype_for, select_device, set_cuda_max_connections
from dali_train.distributed import DistInfo

CONF = Path(__file__).resolve().parents[1] / "conf"


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def make_farm(root: Path, entries: int, classes: int, jpegs: int, workers: int) -> None:
    per_class = max(entries // classes, jpegs)
    make_image_folder(root, num_classes=classes, train_per_class=jpegs, val_per_class=1, width=500, height=375,
                      noise=36.0, workers=workers)  # fmt: skip
    link_copies(root, "train", per_class // jpegs)
    link_copies(root, "val", 50)


LOOP = 100  # empty iterations between two clock reads: ~2 µs of work, so a gap of milliseconds stands out
STALL_S = 0.02  # a gap of the loop longer than this counts as standing still


def beside(start: Callable[[], NextEpoch], rate: float | None = None) -> dict[str, float]:
    """What a Python loop in this thread (as validation's) suffers while `start()`'s thread runs:
    `stalled_s`, its gaps longer than STALL_S (a C++ call that keeps the GIL stops it for its whole
    length) and the longest one; `lost_s`, the loop time lost against `rate` (iterations per second
    of the same loop beside a sleeping thread), which also counts the milliseconds lost when threads
    take turns at the GIL or share the cores; `rate`, this run's own; `seconds`, how long it ran."""
    started = last = time.perf_counter()
    stalled = longest = 0.0
    done = 0
    job = start()
    while not job.ready():
        for _ in range(LOOP):
            pass
        done += LOOP
        now = time.perf_counter()
        if now - last > STALL_S:
            stalled, longest = stalled + now - last, max(longest, now - last)
        last = now
    seconds = time.perf_counter() - started
    if (error := job.join()) is not None:
        raise error
    lost = seconds - done / rate if rate else 0.0  # signed: a negative value is the method's noise
    return {"stalled_s": stalled, "longest_s": longest, "lost_s": lost, "rate": done / seconds, "seconds": seconds}


class _Sleeper:
    """A NextEpoch stand-in that holds no GIL: the method's baseline (its stalls should be ~0)."""

    def __init__(self, seconds: float) -> None:
        self._thread = threading.Thread(target=time.sleep, args=(seconds,))
        self._thread.start()

    def ready(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="the link farm (made if it has no val/; kept for reruns)")
    ap.add_argument("--entries", type=at_least(1), default=1_280_000, help="train entries (default 1,280,000)")
    ap.add_argument("--classes", type=at_least(1), default=1000)
    ap.add_argument("--jpegs-per-class", type=at_least(1), default=4, help="real train JPEGs per class (the rest are links)")
    ap.add_argument("--workers", type=at_least(1), default=8, help="processes that write the JPEGs")
    ap.add_argument("--json", type=Path, help="also write the results here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, overrides = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    if args.json and not args.json.parent.is_dir():  # checked before the minutes of measuring
        ap.error(f"--json {args.json}: no folder {args.json.parent}")
    root = Path(args.root)
    if not (root / "val").is_dir():
        t = time.perf_counter()
        make_farm(root, args.entries, args.classes, args.jpegs_per_class, args.workers)
        print(f"made the link farm in {time.perf_counter() - t:.1f} s (not part of startup)", flush=True)

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        overrides = ["data=imagenet", f"data.root={root}", "data.verify_files=false", *overrides]
        cfg = load_config(compose("config", overrides=overrides))
    set_cuda_max_connections(cfg.trainer.cuda_max_connections)
    dist = DistInfo(0, 0, 1)
    device = select_device(cfg.trainer.device, dist)
    result: dict = {"root": str(root), "device": str(device), "loader": cfg.loader.name}

    def phase(name: str, started: float) -> None:
        result[f"{name}_s"] = time.perf_counter() - started
        result[f"{name}_peak_rss_gib"] = peak_rss_gib()
        print(
            f"{name}: {result[f'{name}_s']:.1f} s, peak host memory {result[f'{name}_peak_rss_gib']:.2f} GiB",
            flush=True,
        )

    t = time.perf_counter()
    dataset = scan_dataset(str(root), verify=False)
    result.update(train_entries=len(dataset.train), val_entries=len(dataset.val))
    phase("listing", t)
    t = time.perf_counter()
    bad = find_bad_files(dataset.train.files + dataset.val.files)
    result["bad_files"] = len(bad)
    phase("preflight_check", t)
    half = amp_dtype_for(cfg.trainer.amp, device) is not None
    loaders = build_loaders(
        cfg.data, cfg.loader, dist, device, half=half, channels_last=cfg.trainer.channels_last, seed=cfg.seed
    )
    for epoch, name in enumerate(("first_batch", "epoch_switch")):
        t = time.perf_counter()
        loaders.train.set_epoch(epoch)
        batches = iter(loaders.train)
        next(batches)
        phase(name, t)
        batches.close()  # the pass left mid-way shuts its pipeline down: not part of the phase
    sleep = beside(lambda: _Sleeper(2.0))  # the method's zero, and the loop's pace to compare with
    switch = beside(lambda: NextEpoch(loaders.train, 2, device), sleep["rate"])
    result.update(
        switch_beside_s=switch["seconds"],
        main_thread_stalled_beside_switch_s=switch["stalled_s"],
        main_thread_longest_stall_s=switch["longest_s"],
        main_thread_lost_beside_switch_s=switch["lost_s"],
        main_thread_stalled_beside_sleep_s=sleep["stalled_s"],
    )
    result["switch_beside_peak_rss_gib"] = peak_rss_gib()
    result["startup_s"] = result["listing_s"] + result["preflight_check_s"] + result["first_batch_s"]
    print(
        f"{result['train_entries']} train + {result['val_entries']} val entries: startup (listing + check + first "
        f"batch) {result['startup_s']:.1f} s; epoch switch {result['epoch_switch_s']:.1f} s; on a thread "
        f"{switch['seconds']:.1f} s, while a Python loop in the main thread lost {switch['lost_s']:.2f} s against its "
        f"pace beside a sleeping thread and stood still {switch['stalled_s']:.2f} s in gaps over {STALL_S * 1000:.0f} ms "
        f"(longest {switch['longest_s']:.2f} s; beside the sleeping thread {sleep['stalled_s']:.2f} s); "
        f"peak host memory {peak_rss_gib():.2f} GiB"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
