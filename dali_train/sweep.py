"""Sweep results: one table of every job's overrides and metrics, sorted by best val top-1.

`write_sweep_summary(multirun_dir)` reads each job's `.hydra/overrides.yaml` and `summary.json`
and writes `sweep_summary.md` and `sweep_summary.csv` beside them. It runs by itself at the end
of every Hydra multirun (`SweepSummaryCallback`, registered in conf/config.yaml) and from
`scripts/sweep_summary.py DIR` for a sweep run by other means (torchrun per point, SLURM).
A sweep over `seed=` gets a second table: each setting's final val top-1 per seed and their mean,
best mean first (choose by the mean, not by one lucky seed). Only completed jobs count in a mean:
a job that ended early (a signal, `epochs_per_job`, divergence) is listed with its `end_state`,
and so is a summary.json that this multirun did not write (its job was refused: the dir held a run).
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

COLUMNS = [
    "job", "overrides", "best_val_top1", "val_top1", "val_top5", "train_img_s", "wall_time_s", "epochs_completed",
    "end_state",
]  # fmt: skip


NO_SUMMARY = "no summary.json (killed, running, or failed before training)"  # a job that left none
EARLIER = "an earlier run's (this sweep's job was refused or wrote none)"  # a summary.json older than the sweep


def collect(multirun_dir: Path, since: float | None = None) -> list[dict[str, Any]]:
    """One row per job; `overrides` lists what differs between jobs (the swept values). A job with
    a config record but no summary.json (killed by SIGKILL or the OOM killer) is listed as such, and
    one whose summary.json is older than `since` (the multirun's start) as an earlier run's."""
    jobs = []
    job_dirs = {p.parent for p in multirun_dir.glob("*/summary.json")} | {
        p.parent.parent for p in multirun_dir.glob("*/.hydra/overrides.yaml")
    }
    for job_dir in sorted(job_dirs):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = (yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else None) or []
        summary = job_dir / "summary.json"
        try:
            ended = json.loads(summary.read_text()) if summary.is_file() else {"end_state": NO_SUMMARY}
        except (OSError, ValueError) as e:  # cut short by a crash: the others are listed all the same
            ended = {"end_state": f"unreadable summary.json ({type(e).__name__})"}
        if since is not None and summary.is_file() and summary.stat().st_mtime < since:
            ended["end_state"] = EARLIER  # its numbers are that run's, outside every mean
        jobs.append((job_dir.name, overrides, ended))
    common = set.intersection(*(set(o) for _, o, _ in jobs)) if len(jobs) > 1 else set()
    rows = [
        {
            "job": name,
            "overrides": " ".join(o for o in overrides if o not in common),
            **{k: s.get(k) for k in COLUMNS[2:]},
            # for by_setting: the swept overrides other than the seed, and the seed
            "_setting": " ".join(o for o in overrides if o not in common and not o.startswith("seed=")),
            "_seed": next((o.removeprefix("seed=") for o in overrides if o.startswith("seed=")), None),
        }
        for name, overrides, s in jobs
    ]
    return sorted(rows, key=lambda r: -(r["best_val_top1"] if r["best_val_top1"] is not None else float("-inf")))


def by_setting(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs grouped by their swept overrides other than `seed=`: the final val top-1 of each seed,
    mean and std of the completed ones. Settings whose every seed completed come first, best mean
    first: a mean over the one seed that did not diverge is no match for one over all of them.
    Empty unless the sweep varied the seed."""
    if len({r["_seed"] for r in rows}) < 2:
        return []
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["_setting"], []).append(r)
    settings = []
    for setting, jobs in groups.items():
        jobs = sorted(jobs, key=lambda r: (len(r["_seed"] or ""), r["_seed"] or ""))  # 2 before 10
        top1 = [r["val_top1"] for r in jobs if r["val_top1"] is not None and r["end_state"] == "completed"]
        settings.append(
            {
                "setting": setting or "defaults",
                "seeds": [r["_seed"] for r in jobs],
                "val_top1": [r["val_top1"] for r in jobs],
                "end_states": [r["end_state"] for r in jobs],
                "mean": statistics.mean(top1) if top1 else None,
                "std": statistics.stdev(top1) if len(top1) > 1 else None,
                "completed": len(top1),
            }
        )
    return sorted(
        settings,
        key=lambda g: (g["completed"] < len(g["seeds"]), -(g["mean"] if g["mean"] is not None else float("-inf"))),
    )


def write_sweep_summary(multirun_dir: str | Path, since: float | None = None) -> list[dict[str, Any]]:
    """Write sweep_summary.{md,csv} in `multirun_dir`; returns the rows, best first. `since`: the
    multirun's start (time.time()), when known: an older summary.json is marked an earlier run's."""
    root = Path(multirun_dir)
    rows = collect(root, since)
    with open(root / "sweep_summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)

    def fmt(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else "" if v is None else str(v)

    def per_seed(g: dict[str, Any]) -> str:  # a job that did not complete: its state, outside the mean
        return " / ".join(
            fmt(v) + ("" if state == "completed" else f" ({state})") for v, state in zip(g["val_top1"], g["end_states"], strict=True)
        )

    def of_seeds(g: dict[str, Any]) -> str:  # a mean over fewer seeds than the setting ran says so
        return "" if g["completed"] == len(g["seeds"]) else f" ({g['completed']} of {len(g['seeds'])})"

    lines = [
        f"# Sweep {root}",
        "",
        f"{len(rows)} jobs, sorted by best val top-1.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    settings = by_setting(rows)
    if settings:
        lines += [
            "",
            "## By setting, over seeds (final val top-1): settings with every seed completed first, best mean first "
            "(a mean is of completed jobs only)",
            "",
            "| setting | seeds | val_top1 per seed | mean | std |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {g['setting']} | {' '.join(map(str, g['seeds']))} | {per_seed(g)} "
            f"| {fmt(g['mean'])}{of_seeds(g)} | {fmt(g['std'])} |"
            for g in settings
        ]
    (root / "sweep_summary.md").write_text("\n".join(lines) + "\n")
    return rows


class SweepSummaryCallback(Callback):
    """Hydra callback: the summary table once all jobs of a multirun have finished."""

    started: float | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()  # a job's summary.json comes seconds later: file-clock coarseness does not matter

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        rows = write_sweep_summary(config.hydra.sweep.dir, self.started)
        rows = [r for r in rows if r["end_state"] != EARLIER]  # the best of this sweep's own jobs
        settings = by_setting(rows)
        if settings and settings[0]["mean"] is not None and settings[0]["completed"] == len(settings[0]["seeds"]):
            log.info(
                "sweep summary: %s/sweep_summary.md (best mean over seeds: %s -> %.2f)",
                config.hydra.sweep.dir,
                settings[0]["setting"],
                settings[0]["mean"],
            )
        elif rows and rows[0]["best_val_top1"] is not None:
            log.info(
                "sweep summary: %s/sweep_summary.md (best: %s -> %.2f)",
                config.hydra.sweep.dir,
                rows[0]["overrides"] or "defaults",
                rows[0]["best_val_top1"],
            )
        elif rows:
            log.info("sweep summary: %s/sweep_summary.md (no job validated)", config.hydra.sweep.dir)
