#!/usr/bin/env python
"""A sweep whose every point uses all GPUs of this node: one `torchrun` per point, in turn.

Hydra's own multirun runs its jobs inside one process, which cannot become a multi-GPU torchrun
job. This wrapper expands the same sweep syntax (`a=1,2 b=x,y`: the cartesian product, parsed by
Hydra's override parser) and runs `torchrun --nproc_per_node=N train.py <point>` for each point
into multirun/STAMP/<n>/, then writes the sweep summary table there.

    python scripts/sweep_torchrun.py --nproc 8 -- optimizer.lr=0.05,0.1,0.2 model=resnet50 data=imagenet data.root=/data/imagenet

For sweeps over several nodes use SLURM (hydra/launcher=slurm; see README).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import subprocess
import sys
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from dali_train.cli import at_least
from dali_train.sweep import write_sweep_summary

REPO = Path(__file__).resolve().parents[1]


def expand(overrides: list[str]) -> list[list[str]]:
    """The cartesian product of the sweep overrides, each point as a list of plain overrides."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    axes = []
    for o in parsed:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    return [list(point) for point in itertools.product(*axes)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=at_least(1), default=1, help="processes (GPUs) per point")
    ap.add_argument("--out", default=None, help="sweep folder (default multirun/DATE/TIME)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides; comma lists are swept")
    args = ap.parse_args()
    try:
        points = expand(args.overrides)
    except HydraException as e:  # an override Hydra cannot parse: its first line, as train.py gives it
        sys.exit(f"error: the overrides: {str(e).strip().splitlines()[0]}")
    now = dt.datetime.now()  # with ms and pid, as train.py's run stamp: two sweeps started in one second stay apart
    out = Path(args.out or f"multirun/{now:%Y-%m-%d/%H-%M-%S}.{now.microsecond // 1000:03d}_{os.getpid()}")
    if not args.dry_run and out.is_dir() and any(out.iterdir()):  # its summary would count the old jobs too
        sys.exit(f"error: --out {out}: holds files already; choose a new folder")
    failed = 0
    for n, point in enumerate(points):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={args.nproc}",
            str(REPO / "train.py"),
            *point,
            f"hydra.run.dir={out / str(n)}",
        ]
        print(f"[{n + 1}/{len(points)}] {' '.join(point)}", flush=True)
        if args.dry_run:
            print("  " + " ".join(cmd))
            continue
        env = {k: v for k, v in os.environ.items() if k != "DALI_TRAIN_RUN_STAMP"}
        if subprocess.run(cmd, env=env).returncode:
            failed += 1
            print(f"  point {n} failed; continuing", file=sys.stderr)
    if not args.dry_run:
        if not any(out.glob("*/summary.json")):  # no point got as far as its run dir (a typo in an override, say)
            sys.exit(f"error: none of the {len(points)} points wrote a summary.json under {out}; see their output above")
        write_sweep_summary(out)
        print((out / "sweep_summary.md").read_text())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
