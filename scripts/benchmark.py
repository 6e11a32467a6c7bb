#!/usr/bin/env python
"""Throughput benchmark built from the app's own loaders, model builder and training step.

Modes (a list; all run in one process so their ratios compare like with like):
  loader  loader-only img/s for each of --loaders (decode + augment, no model)
  model   training steps on synthetic batches already on the device: the model-only ceiling
  e2e     training steps fed by each of --loaders
`--compare` = all three, then the ratios that matter: e2e ÷ model ceiling, dali ÷ pytorch.
Warm-up steps are excluded; each figure is the median of --repeats timed windows.

    python scripts/benchmark.py --compare --models resnet50 resnet18 --loaders dali pytorch \\
        --compile off on --out bench/ -- data=imagenet data.root=data/synthetic loader.batch_size=256
    python scripts/benchmark.py --modes loader --loaders dali_cpu --steps 3 --warmup 1 -- trainer.device=cpu ...

Everything after `--` is a Hydra override of conf/ (as for train.py). Writes results.json,
results.md and results.png (if matplotlib is installed) to --out.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from dali_train.config import Config, load_config, register_configs  # noqa: E402
from dali_train.data import build_loaders  # noqa: E402
from dali_train.device import amp_dtype_for, configure_backends, select_device  # noqa: E402
from dali_train.distributed import init_distributed, shutdown  # noqa: E402
from dali_train.engine import TrainParts, train_step  # noqa: E402
from dali_train.loss import build_loss  # noqa: E402
from dali_train.models import build_model, wrap_for_training  # noqa: E402
from dali_train.optim import build_optimizer, build_scheduler  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
LOADERS = ("dali", "dali_cpu", "pytorch")  # the loaders a benchmark row or --variant can build on


def make_cfg(overrides: list[str]) -> Config:
    """The typed run config of `overrides`, as train.py composes and checks it."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose("config", overrides=overrides))


def make_loaders(cfg: Config, dist, device, half: bool):
    return build_loaders(
        cfg.data, cfg.loader, dist, device, half=half, channels_last=cfg.trainer.channels_last, seed=cfg.seed
    )


def make_train_parts(cfg: Config, dist, device, *, num_classes: int, updates_per_epoch: int) -> TrainParts:
    """The model, wrapped, with its loss, optimizer and schedule: train.py's build_train_parts
    (without its seeding), from the same builders."""
    tc = cfg.trainer
    model, ema = wrap_for_training(
        build_model(cfg.model, num_classes),
        device,
        dist,
        channels_last=tc.channels_last,
        sync_bn=tc.sync_bn,
        ema_decay=tc.ema_decay if tc.ema else None,
        compile=tc.compile,
    )
    loss_fn, mixup = build_loss(
        label_smoothing=tc.label_smoothing,
        mixup_alpha=tc.mixup_alpha,
        cutmix_alpha=tc.cutmix_alpha,
        num_classes=num_classes,
    )
    global_batch = cfg.loader.batch_size * dist.world_size * tc.grad_accum_steps
    optimizer = build_optimizer(cfg.optimizer, model, global_batch=global_batch)
    amp_dtype = amp_dtype_for(tc.amp, device)
    return TrainParts(
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(cfg.scheduler, optimizer, steps_per_epoch=updates_per_epoch, epochs=tc.epochs),
        loss_fn=loss_fn,
        device=device,
        dist=dist,
        amp_dtype=amp_dtype,
        scaler=torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None,
        ema=ema,
        mixup=mixup,
        grad_accum_steps=tc.grad_accum_steps,
        clip_grad_norm=tc.clip_grad_norm,
    )


class Endless:
    """Batches across epoch boundaries. Each boundary builds the next epoch's pipeline, as in
    training; the time that takes is kept in `switch_s` so the timed windows can leave it out:
    train.py builds the next pipeline before validation, so it does not stall training steps.
    `results.json` reports it (epoch_switch_s) next to the steady-state rates."""

    def __init__(self, loader, hold: int = 0) -> None:
        self.loader, self.switch_s = loader, []
        self._batches = self._generate()
        self._held = collections.deque(maxlen=hold) if hold else None

    def _generate(self):
        for epoch in itertools.count():
            t = time.perf_counter()
            self.loader.set_epoch(epoch)
            self.switch_s.append(time.perf_counter() - t)
            yield from self.loader

    def __next__(self):
        batch = next(self._batches)
        if self._held is not None:
            self._held.append(batch)
        return batch

    def __iter__(self):
        return self


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_window(batches, work, *, device, steps: int, out: Path, name: str) -> None:
    """torch.profiler over `steps` batches: the ops/kernels by device time, a gzipped Chrome trace,
    and `profile_summary.summarize` of it (per-stream busy time: CUPTI sees the whole process, so
    DALI's kernels show up next to the model's). Host waits for batches are `data wait` ranges."""
    import gzip
    import shutil

    from profile_summary import load_events, summarize
    from torch.profiler import ProfilerActivity, profile, record_function

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


def timed_windows(
    batches: Endless, work, *, device, batch_size, world_size, steps, warmup, repeats, profile_to=None, name=""
) -> dict:
    """Run `work(images, labels)` per batch; time `repeats` windows of `steps` after `warmup`
    (and, with `profile_to`, profile one more window after the timed ones). Rates count all ranks."""
    for _ in range(warmup):
        work(*next(batches))
    sync(device)
    rates, waits = [], []
    for _ in range(repeats):
        switches = len(batches.switch_s)
        wait, start = 0.0, time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            images, labels = next(batches)
            wait += time.perf_counter() - t
            work(images, labels)
        sync(device)
        switch = sum(batches.switch_s[switches:])  # pipeline builds at epoch boundaries: left out
        elapsed = time.perf_counter() - start - switch
        rates.append(steps * batch_size * world_size / elapsed)
        waits.append((wait - switch) / elapsed)
    if profile_to is not None:
        profile_window(batches, work, device=device, steps=min(steps, 20), out=profile_to, name=name)
    return {
        "img_s": statistics.median(rates),
        "img_s_all": rates,
        "data_wait_frac": statistics.median(waits),
        "epoch_switch_s": statistics.median(batches.switch_s[1:]) if len(batches.switch_s) > 1 else None,
    }


def build_timing(loader) -> dict:
    """Median DALI pipeline build and first-batch seconds of the train loader (what an epoch switch costs)."""
    times = getattr(loader, "build_times", [])
    if not times:
        return {}
    return {"build_s": statistics.median(b for b, _ in times), "first_batch_s": statistics.median(f for _, f in times)}


def measure(loaders, work, cfg, dist, device, args, **profiling) -> dict:
    """Timed windows of `work` over the train loader's batches, plus its pipeline build times."""
    result = timed_windows(
        Endless(loaders.train, hold=args.hold_batches),
        work,
        device=device,
        batch_size=cfg.loader.batch_size,
        world_size=dist.world_size,
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        **profiling,
    )
    return build_timing(loaders.train) | result


def bench_loader(cfg, dist, device, half, args) -> dict:
    return measure(make_loaders(cfg, dist, device, half), lambda x, y: None, cfg, dist, device, args)


def bench_training(cfg, dist, device, parts, loaders, args, loader_key: str) -> dict:
    parts.model.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    result = measure(
        loaders,
        lambda x, y: train_step(parts, x, y, update=True),
        cfg,
        dist,
        device,
        args,
        profile_to=Path(args.profile) if args.profile else None,
        name=f"{cfg.model.name}_{loader_key}_compile{int(cfg.trainer.compile)}"
        + (f"_rank{dist.rank}" if dist.enabled else ""),
    )
    if device.type == "cuda":
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def loader_cfg(args, overrides: list[str], name: str):
    """The config of loader `name`: a conf/loader group, or a --variant built on one."""
    base, extra = args.variants.get(name, (name, []))
    return make_cfg([*overrides, f"loader={base}", *args.loader_overrides.get(base, []), *extra])


def say(dist, line: str) -> None:
    if dist.is_main:
        print(line, flush=True)


def run(args, dist) -> list[dict]:
    rows = []
    base = make_cfg(args.overrides)
    device = select_device(base.trainer.device, dist)
    configure_backends(device, deterministic=False, cudnn_benchmark=True)
    half = amp_dtype_for(base.trainer.amp, device) is not None
    if "loader" in args.modes:
        for name in args.loaders:
            cfg = loader_cfg(args, args.overrides, name)
            r = bench_loader(cfg, dist, device, half, args)
            rows.append({"mode": "loader", "loader": name, "model": "-", "compile": "-", **r})
            say(dist, f"loader-only {name}: {r['img_s']:.0f} img/s")
    for model, compile_ in itertools.product(args.models, args.compile):
        common = [*args.overrides, f"model.name={model}", f"trainer.compile={compile_ == 'on'}"]
        loaders_by_name = {}
        if "model" in args.modes:
            loaders_by_name["synthetic"] = make_cfg([*common, "loader=synthetic"])
        if "e2e" in args.modes:
            for name in args.loaders:
                loaders_by_name[name] = loader_cfg(args, common, name)
        parts = None
        num_classes = None
        for name, cfg in loaders_by_name.items():
            if name == "synthetic" and num_classes is not None:
                cfg.loader.synthetic_num_classes = num_classes
            loaders = make_loaders(cfg, dist, device, half)
            if parts is None:  # one model per (model, compile): e2e and model-only share it
                num_classes = loaders.num_classes
                parts = make_train_parts(cfg, dist, device, num_classes=num_classes, updates_per_epoch=len(loaders.train))
            r = bench_training(cfg, dist, device, parts, loaders, args, name)
            mode = "model" if name == "synthetic" else "e2e"
            rows.append({"mode": mode, "loader": name, "model": model, "compile": compile_, **r})
            rate = f"{r['img_s']:.0f} img/s, data wait {r['data_wait_frac']:.1%}"
            say(dist, f"{mode} {model} compile={compile_} {name}: {rate}")
    return rows


def ratios(rows: list[dict]) -> list[str]:
    out = []
    ceiling = {(r["model"], r["compile"]): r["img_s"] for r in rows if r["mode"] == "model"}
    for r in rows:
        if r["mode"] == "e2e" and (r["model"], r["compile"]) in ceiling:
            out.append(
                f"e2e {r['loader']} ÷ model-only, {r['model']} compile={r['compile']}: "
                f"{r['img_s'] / ceiling[(r['model'], r['compile'])]:.1%}"
            )
    for mode in ("loader", "e2e"):
        by = {(r["model"], r["compile"], r["loader"]): r["img_s"] for r in rows if r["mode"] == mode}
        for (model, comp, name), v in by.items():
            if name == "dali" and (model, comp, "pytorch") in by:
                out.append(f"{mode} dali ÷ pytorch ({model}, compile={comp}): {v / by[(model, comp, 'pytorch')]:.2f}×")
    return out


def write_outputs(rows: list[dict], notes: list[str], out: Path, args, world_size: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "processes": world_size,
    }
    try:
        import nvidia.dali as dali

        env["dali"] = dali.__version__
    except ImportError:
        pass
    (out / "results.json").write_text(
        json.dumps({"env": env, "argv": sys.argv, "rows": rows, "ratios": notes}, indent=2)
    )
    lines = [f"{k}: {v}" for k, v in env.items()] + [
        "",
        "| mode | model | compile | loader | img/s | data wait | peak GiB | epoch switch s |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        mem = f"{r['peak_mem_gib']:.1f}" if "peak_mem_gib" in r else "-"
        switch = f"{r['epoch_switch_s']:.2f}" if r.get("epoch_switch_s") is not None else "-"
        lines.append(
            f"| {r['mode']} | {r['model']} | {r['compile']} | {r['loader']} | {r['img_s']:.0f} | "
            f"{r['data_wait_frac']:.1%} | {mem} | {switch} |"
        )
    lines += [""] + [f"- {n}" for n in notes]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['mode']}\n{r['model']}/{r['compile']}\n{r['loader']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    ax.bar(
        range(len(rows)),
        [r["img_s"] for r in rows],
        color=["C0" if r["mode"] == "loader" else "C1" if r["mode"] == "model" else "C2" for r in rows],
    )
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("images / s")
    ax.set_title(f"dali-train benchmark ({env['device']})")
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=120)


def parse_args(argv: list[str]):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["loader", "model", "e2e"], choices=["loader", "model", "e2e"])
    ap.add_argument("--compare", action="store_true", help="all modes, then the ratios")
    ap.add_argument("--loaders", nargs="+", default=["dali", "pytorch"], help="dali, dali_cpu, pytorch or a --variant")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=LOADER:KEY=VALUE[,KEY=VALUE]",
        help="a named loader configuration to list in --loaders, e.g. dali-t12=dali:loader.num_threads=12",
    )
    ap.add_argument(
        "--hold-batches",
        type=int,
        default=0,
        help="keep the last N batches referenced (diagnostic: does releasing a DALI batch wait for the GPU?)",
    )
    ap.add_argument("--models", nargs="+", default=["resnet50"], help="timm model names")
    ap.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"])
    ap.add_argument("--steps", type=int, default=50, help="batches per timed window")
    ap.add_argument("--warmup", type=int, default=20, help="batches before timing (cudnn autotune, compile)")
    ap.add_argument("--repeats", type=int, default=3, help="timed windows; the median is reported")
    ap.add_argument(
        "--loader-set",
        action="append",
        default=[],
        metavar="LOADER:KEY=VALUE",
        help="an override for one loader only, e.g. pytorch:loader.num_workers=16",
    )
    ap.add_argument("--out", default="outputs/benchmark", help="folder for results.{json,md,png}")
    ap.add_argument("--profile", metavar="DIR", help="also profile 20 training steps of each model/e2e run into DIR")
    own, _, overrides = (argv + ["--"])[: (argv + ["--"]).index("--")], None, argv[(argv + ["--"]).index("--") + 1 :]
    args = ap.parse_args(own)
    args.overrides = overrides
    args.loader_overrides, args.variants = {}, {}
    for item in args.variant:
        name, _, spec = item.partition("=")
        base, _, kvs = spec.partition(":")
        overrides = [kv for kv in kvs.split(",") if kv]
        if not name or base not in LOADERS or not all("=" in kv for kv in overrides):
            ap.error(
                f"--variant {item}: expected NAME=LOADER:KEY=VALUE[,KEY=VALUE] with LOADER one of {', '.join(LOADERS)}"
            )
        args.variants[name] = (base, overrides)
    unknown = [n for n in args.loaders if n not in args.variants and n not in LOADERS]
    if unknown:
        ap.error(f"--loaders: {', '.join(unknown)} is neither dali, dali_cpu, pytorch nor a --variant name")
    for item in args.loader_set:
        name, _, kv = item.partition(":")
        args.loader_overrides.setdefault(name, []).append(kv)
    if args.compare:
        args.modes = ["loader", "model", "e2e"]
    return args


def main() -> None:
    args = parse_args(sys.argv[1:])
    dist = init_distributed()  # under torchrun: one process per GPU, DDP; rates count all ranks
    rows = run(args, dist)
    shutdown()
    if not dist.is_main:
        return
    notes = ratios(rows)
    write_outputs(rows, notes, Path(args.out), args, world_size=dist.world_size)
    print("\n".join(notes))
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
