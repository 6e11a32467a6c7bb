#!/usr/bin/env python
"""Throughput benchmark built from the app's own loaders, model builder and training step.

Modes (a list; all run in one process so their ratios compare like with like):
  loader  loader-only img/s for each of --loaders (decode + augment, no model)
  model   training steps on synthetic batches already on the device: the model-only ceiling
  e2e     training steps fed by each of --loaders
`--compare` = all three, then the ratios that matter: e2e ÷ model ceiling, dali ÷ pytorch.
`--tune` = e2e on the first of --models for each point of a small grid of loader=dali settings;
writes the fastest to conf/local/loader/dali.yaml (merged into what is there) and prints the table.

Warm-up steps are excluded; each figure is the median of --repeats timed windows, and no window
contains an epoch switch (if an epoch has too few steps left, the rest is drained and the next
epoch warmed up first). What a switch costs (pipeline build, first batch) is reported apart.
Epochs must be long for this: make the data with `make_synthetic_imagenet.py --links N`.

    python scripts/benchmark.py --compare --models resnet50 resnet18 --loaders dali pytorch \\
        --compile off reduce-overhead --out bench/ -- data=imagenet data.root=data/synthetic
    python scripts/benchmark.py --tune --models resnet18 -- data=imagenet data.root=data/synthetic

Everything after `--` is a Hydra override of conf/ (as for train.py). Writes results.json,
results.md and, with --plot, results.png (needs matplotlib) to --out.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dali_train.config import COMPILE_MODES, Config, load_config, register_configs
from dali_train.config_errors import composition_error_line
from dali_train.data import build_loaders
from dali_train.data.folder import list_classes
from dali_train.device import amp_dtype_for, configure_backends, select_device, set_cuda_max_connections
from dali_train.distributed import init_distributed, shutdown
from dali_train.engine import TrainParts, train_step
from dali_train.errors import UserError, print_error
from dali_train.parts import build_train_parts
from dali_train.throughput import PROFILE_STEPS, Endless, build_timing, profiled_window, timed_windows

CONF = Path(__file__).resolve().parents[1] / "conf"
LOADERS = ("dali", "dali_cpu", "pytorch")  # the loaders a benchmark row or --variant can build on
TUNE_GRID = {  # --tune's default grid: loader=dali's knobs that moved e2e img/s on the H200
    "loader.num_threads": [4, 8, 12],
    "loader.hw_decoder_load": [0.65, 1.0],
    "loader.prefetch_queue_depth": [2, 3],
}


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
    """The model, wrapped, with its loss, optimizer and schedule, exactly as train.py builds them."""
    tc = cfg.trainer
    return build_train_parts(
        cfg.model,
        cfg.optimizer,
        cfg.scheduler,
        tc,
        seed=cfg.seed,
        dist=dist,
        device=device,
        num_classes=num_classes,
        updates_per_epoch=updates_per_epoch,
        global_batch=cfg.loader.batch_size * dist.world_size * tc.grad_accum_steps,
        amp_dtype=amp_dtype_for(tc.amp, device),
    )


def fail(message: str) -> None:
    """A one-line error and exit code 2, as train.py and argparse do."""
    print_error(message)  # one write: every rank of a torchrun prints it
    sys.exit(2)


def measure(loaders, work, cfg, dist, device, args) -> dict:
    """Timed windows of `work` over the train loader's batches, plus its pipeline build times."""
    needed = args.warmup + max(args.steps, PROFILE_STEPS if args.profile else 0)
    if len(loaders.train) < needed:
        what = f"--warmup + max(--steps, {PROFILE_STEPS} of --profile)" if args.profile else "--warmup + --steps"
        fail(
            f"data.root={cfg.data.root}: an epoch has {len(loaders.train)} steps per process, a timed window needs "
            f"{needed} ({what}) inside one; make a longer set (make_synthetic_imagenet.py --links N)"
        )
    batches = Endless(loaders.train, hold=args.hold_batches)
    try:
        result = timed_windows(
            batches,
            work,
            device=device,
            batch_size=cfg.loader.batch_size,
            world_size=dist.world_size,
            steps=args.steps,
            warmup=args.warmup,
            repeats=args.repeats,
        )
    finally:
        batches.close()
    return build_timing(loaders.train) | result


def bench_loader(cfg, dist, device, half, args) -> dict:
    return measure(make_loaders(cfg, dist, device, half), lambda x, y: None, cfg, dist, device, args)


def bench_training(cfg, dist, device, parts, loaders, args, loader_key: str) -> dict:
    parts.model.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    result = measure(loaders, lambda x, y: train_step(parts, x, y, update=True), cfg, dist, device, args)
    if device.type == "cuda":
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def profile_training(cfg, dist, device, parts, args, loader_key: str) -> None:
    """--profile: 20 training steps of a row under torch.profiler, on fresh loaders, after every
    row's timed windows (`throughput.profiled_window` says why)."""
    half = amp_dtype_for(cfg.trainer.amp, device) is not None
    batches = Endless(make_loaders(cfg, dist, device, half).train, hold=args.hold_batches)
    parts.model.train()
    try:
        profiled_window(
            batches,
            lambda x, y: train_step(parts, x, y, update=True),
            device=device,
            warmup=args.warmup,
            out=Path(args.profile),
            name=f"{cfg.model.name}_{loader_key}_compile{cfg.trainer.compile_mode if cfg.trainer.compile else 'off'}"
            + (f"_rank{dist.rank}" if dist.enabled else ""),
        )
    finally:
        batches.close()


def loader_cfg(args, overrides: list[str], name: str):
    """The config of loader `name`: a conf/loader group, or a --variant built on one."""
    base, extra = args.variants.get(name, (name, []))
    own = args.loader_overrides.get(name, []) if name != base else []  # --loader-set VARIANT:K=V, after its own
    return make_cfg([*overrides, f"loader={base}", *args.loader_overrides.get(base, []), *extra, *own])


def dataset_classes(cfg) -> int | None:
    """The class folders of a config's train split, where they are on disk already (not the sample
    set, made on first use: its few classes fit the synthetic default)."""
    train = Path(cfg.data.root) / "train"
    return len(list_classes(train)) if train.is_dir() else None


def say(dist, line: str) -> None:
    if dist.is_main:
        print(line, flush=True)


def compile_overrides(compile_: str) -> list[str]:
    """--compile off | MODE -> the trainer overrides."""
    if compile_ == "off":
        return ["trainer.compile=false"]
    return ["trainer.compile=true", f"trainer.compile_mode={compile_}"]


def run(args, dist, device) -> list[dict]:
    rows, to_profile = [], []  # (config, TrainParts, loader name) of each row to profile once all are timed
    base = make_cfg(args.overrides)
    half = amp_dtype_for(base.trainer.amp, device) is not None
    if "loader" in args.modes:
        for name in args.loaders:
            cfg = loader_cfg(args, args.overrides, name)
            r = bench_loader(cfg, dist, device, half, args)
            rows.append({"mode": "loader", "loader": name, "model": "-", "compile": "-", **r})
            say(dist, f"loader-only {name}: {r['img_s']:.0f} img/s")
    # The model-only loader yields enough batches that its windows never cross an epoch either.
    synthetic_steps = args.warmup + args.repeats * args.steps + (PROFILE_STEPS if args.profile else 0)
    for model, compile_ in itertools.product(args.models, args.compile):
        common = [*args.overrides, f"model.name={model}", *compile_overrides(compile_)]
        loaders_by_name = {}
        if "model" in args.modes:
            loaders_by_name["synthetic"] = None  # measured first; its label range is the dataset's, below
        if "e2e" in args.modes:
            for name in args.loaders:
                loaders_by_name[name] = loader_cfg(args, common, name)
        if "model" in args.modes:
            # The model is built on the first loader's class count: the synthetic labels must fit the dataset's head
            classes = next((dataset_classes(c) for c in loaders_by_name.values() if c is not None), None)
            loaders_by_name["synthetic"] = make_cfg(
                [*common, "loader=synthetic", f"loader.synthetic_steps={synthetic_steps}"]
                + ([f"loader.synthetic_num_classes={classes}"] if classes else [])
            )
        parts = None
        for name, cfg in loaders_by_name.items():
            loaders = make_loaders(cfg, dist, device, half)
            if parts is None:  # one model per (model, compile): e2e and model-only share it
                parts = make_train_parts(
                    cfg, dist, device, num_classes=loaders.num_classes, updates_per_epoch=len(loaders.train)
                )
            r = bench_training(cfg, dist, device, parts, loaders, args, name)
            mode = "model" if name == "synthetic" else "e2e"
            rows.append({"mode": mode, "loader": name, "model": model, "compile": compile_, **r})
            rate = f"{r['img_s']:.0f} img/s, data wait {r['data_wait_frac']:.1%}"
            say(dist, f"{mode} {model} compile={compile_} {name}: {rate}")
            if args.profile:
                to_profile.append((cfg, parts, name))
    for cfg, parts, name in to_profile:
        profile_training(cfg, dist, device, parts, args, name)
    return rows


def tune(args, dist, device) -> list[dict]:
    """e2e img/s of the first --models (and --compile) for every point of --grid on loader=dali;
    one model serves all points, so they differ only in the loader."""
    model, compile_ = args.models[0], args.compile[0]
    common = [*args.overrides, f"model.name={model}", *compile_overrides(compile_), "loader=dali"]
    common += args.loader_overrides.get("dali", [])  # --loader-set dali:K=V holds beside the grid's keys
    half = amp_dtype_for(make_cfg(common).trainer.amp, device) is not None
    keys = list(args.grid)
    rows, parts = [], None
    for values in itertools.product(*args.grid.values()):
        settings = dict(zip(keys, values, strict=True))
        cfg = make_cfg([*common, *(f"{k}={v}" for k, v in settings.items())])
        loaders = make_loaders(cfg, dist, device, half)
        if parts is None:
            parts = make_train_parts(
                cfg, dist, device, num_classes=loaders.num_classes, updates_per_epoch=len(loaders.train)
            )
        label = " ".join(f"{k.removeprefix('loader.')}={v}" for k, v in settings.items())
        r = bench_training(cfg, dist, device, parts, loaders, args, "dali")
        rows.append({"mode": "tune", "loader": label, "model": model, "compile": compile_, "settings": settings, **r})
        say(dist, f"tune {model} compile={compile_} {label}: {r['img_s']:.0f} img/s")
        del loaders  # free this point's pipelines before the next builds
    return rows


def write_best(rows: list[dict], path: Path) -> str:
    """Merge the fastest --tune point into `path`: conf/local/loader/dali.yaml, which loader=dali
    reads after its own keys (its keys exist only in the DALI loaders' schema)."""
    best = max(rows, key=lambda r: r["img_s"])
    conf = OmegaConf.load(path) if path.is_file() else OmegaConf.create()
    for key, value in best["settings"].items():
        OmegaConf.update(conf, key.removeprefix("loader."), value, force_add=True)
    header = (
        f"# loader=dali: fastest e2e setting of `scripts/benchmark.py --tune` ({best['model']}, "
        f"compile={best['compile']}, {best['img_s']:.0f} img/s, {time.strftime('%Y-%m-%d')}).\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + OmegaConf.to_yaml(conf))
    return f"best: {best['loader']} ({best['img_s']:.0f} img/s), written to {path}"


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
        "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
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
        "| mode | model | compile | loader | img/s | windows | data wait | peak GiB | build s | first batch s |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|",
    ]

    def num(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if r.get(key) is not None else "-"

    for r in rows:
        windows = " ".join(f"{v:.0f}" for v in r["img_s_all"])
        lines.append(
            f"| {r['mode']} | {r['model']} | {r['compile']} | {r['loader']} | {r['img_s']:.0f} | {windows} | "
            f"{r['data_wait_frac']:.1%} | {num(r, 'peak_mem_gib', '.1f')} | {num(r, 'build_s', '.2f')} | "
            f"{num(r, 'first_batch_s', '.2f')} |"
        )
    lines += [
        "",
        "img/s: median of the timed windows (each listed), none containing an epoch switch; build s and first batch s:",
        "what an epoch switch costs (the pipeline is rebuilt per epoch; train.py does it during validation).",
        "",
    ] + [f"- {n}" for n in notes]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    if args.plot:
        plot(rows, out / "results.png", env["device"])


def plot(rows: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['mode']}\n{r['model']}/{r['compile']}\n{r['loader']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    ax.bar(
        range(len(rows)),
        [r["img_s"] for r in rows],
        color=["C0" if r["mode"] == "loader" else "C1" if r["mode"] == "model" else "C2" for r in rows],
    )
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("images / s")
    ax.set_title(f"dali-train benchmark ({device})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
    ap.add_argument(
        "--compile", nargs="+", default=["off"], choices=["off", *COMPILE_MODES], help="off or a torch.compile mode"
    )
    ap.add_argument("--steps", type=int, default=100, help="batches per timed window")
    ap.add_argument("--warmup", type=int, default=30, help="batches before timing (cudnn autotune, compile, refill)")
    ap.add_argument("--repeats", type=int, default=3, help="timed windows; the median is reported")
    ap.add_argument(
        "--loader-set",
        action="append",
        default=[],
        metavar="LOADER:KEY=VALUE",
        help="an override for one loader only, e.g. pytorch:loader.num_workers=16",
    )
    ap.add_argument("--out", default="outputs/benchmark", help="folder for results.{json,md,png}")
    ap.add_argument("--plot", action="store_true", help="also write results.png (needs matplotlib)")
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="also profile 20 training steps of each model/e2e row into DIR, once all are timed (each model stays "
        "in memory until then, so later rows' peak GiB include the earlier models)",
    )
    ap.add_argument("--tune", action="store_true", help="e2e over --grid on loader=dali; write the best to --local")
    ap.add_argument(
        "--grid",
        nargs="+",
        metavar="KEY=V1,V2",
        default=[f"{k}={','.join(map(str, v))}" for k, v in TUNE_GRID.items()],
        help="--tune's grid (default: %(default)s)",
    )
    ap.add_argument(
        "--local",
        type=Path,
        default=CONF / "local" / "loader" / "dali.yaml",
        help="where --tune merges the best (git-ignored; loader=dali reads it)",
    )
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
        if (name not in LOADERS and name not in args.variants) or "=" not in kv:
            ap.error(
                f"--loader-set {item}: expected LOADER:KEY=VALUE with LOADER one of {', '.join(LOADERS)} or a --variant"
            )
        args.loader_overrides.setdefault(name, []).append(kv)
    for flag in ("steps", "warmup", "repeats"):  # warm-up 0 would time the first batch's pipeline build
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} {getattr(args, flag)}: must be at least 1")
    if args.compare:
        args.modes = ["loader", "model", "e2e"]
    grid = {}
    for item in args.grid:
        key, _, values = item.partition("=")
        if not key.startswith("loader.") or not values:
            ap.error(f"--grid {item}: expected loader.KEY=V1,V2,...")
        if key in ("loader.name", "loader.batch_size"):  # the winner is written for every later run to use
            ap.error(f"--grid {item}: a throughput knob of loader=dali only; {key} changes what a run is")
        grid[key] = [yaml.safe_load(v) for v in values.split(",")]  # "8" -> 8: numbers in the written file
    args.grid = grid
    # Paths written after minutes of measuring: checked now, so that no result is lost to them then
    if Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out {args.out}: a file; results go in a folder")
    if args.tune and args.profile:
        ap.error("--profile: not with --tune (profile the winner with a plain run and --variant)")
    if args.tune and args.local.is_dir():
        ap.error(f"--local {args.local}: a folder; --tune merges its best into a YAML file")
    if args.tune and args.local.is_file():
        try:
            OmegaConf.load(args.local)
        except Exception as e:  # noqa: BLE001 - any YAML error: the file would not merge
            ap.error(f"--local {args.local}: not YAML the best can merge into ({type(e).__name__})")
    return args


def local_loader_files() -> dict[str, str]:
    """The git-ignored conf/local/ files a run composes with (--tune writes loader/dali.yaml): their
    keys change what a row measures, so results.json records them and the run says so."""
    files = [CONF / "local" / "default.yaml", *sorted((CONF / "local" / "loader").glob("*.yaml"))]
    return {str(p.relative_to(CONF.parent)): p.read_text() for p in files if p.is_file()}


def main() -> None:
    args = parse_args(sys.argv[1:])
    try:
        _main(args)
    except (UserError, HydraException, OmegaConfBaseException) as e:  # as train.py: one line, exit 2
        fail(str(e) if isinstance(e, UserError) else composition_error_line(e))


def _main(args) -> None:
    base = make_cfg(args.overrides)
    set_cuda_max_connections(base.trainer.cuda_max_connections)  # before anything starts CUDA, as in train.py
    dist = init_distributed()  # under torchrun: one process per GPU, DDP; rates count all ranks
    device = select_device(base.trainer.device, dist)
    tc = base.trainer  # as train.py sets them: `-- trainer.tf32=false` and the like apply here too
    configure_backends(device, deterministic=tc.deterministic, cudnn_benchmark=tc.cudnn_benchmark, tf32=tc.tf32)
    rows = tune(args, dist, device) if args.tune else run(args, dist, device)
    shutdown()
    if not dist.is_main:
        return
    local = local_loader_files()
    notes = ratios(rows) + [f"{name} applies: {' '.join(text.split())}" for name, text in local.items()]
    write_outputs(rows, notes, Path(args.out), args, world_size=dist.world_size)  # first: nothing measured is lost
    if args.tune:
        best = write_best(rows, args.local)
        write_outputs(rows, [*notes, best], Path(args.out), args, world_size=dist.world_size)
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    # As train.py: the imports' objects frozen out of the cycle collector, so the measured steps see
    # the collections a training run sees (and each rank exits ~1 s sooner). Not where a process
    # froze its own already (the tests run this file in-process).
    if not gc.get_freeze_count():
        gc.freeze()
    main()
