#!/usr/bin/env python
"""Summarize a sweep folder (multirun/DATE/TIME): each job's overrides -> best val top-1, top-5,
img/s and wall time, sorted by top-1, as sweep_summary.md and sweep_summary.csv in that folder.

    python scripts/sweep_summary.py multirun/2026-11-29/21-10-00

Hydra multiruns and scripts/sweep_torchrun.py write it by themselves at the end; use this for SLURM
arrays, or to refresh a table while a sweep is running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dali_train.sweep import write_sweep_summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("multirun_dir", help="the sweep folder holding one subfolder per job")
    args = ap.parse_args()
    root = Path(args.multirun_dir)
    if not root.is_dir():
        sys.exit(f"error: {root}: no such folder")
    rows = write_sweep_summary(root)
    if not rows:
        sys.exit(f"error: {root}: no <job>/summary.json found (have the jobs finished?)")
    print((root / "sweep_summary.md").read_text())


if __name__ == "__main__":
    main()
