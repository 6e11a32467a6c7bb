#!/usr/bin/env python
"""Seeds of a recipe → one markdown row: last-epoch top-1 per seed, mean ± std (and without flip TTA,
where the runs validated with it), val_samples, wall time, and time to accuracy marks (the first
epoch whose val top-1 reached each, from metrics.jsonl).

    python scripts/recipe_summary.py OUT/runs/imagenette_128_5ep_s0 OUT/runs/imagenette_128_5ep_s1 ...

Run dirs are grouped by name with the trailing `_s<seed>` removed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def time_to(rows: list[dict], mark: float) -> float | None:
    """Wall time at the end of the first validated epoch that reached `mark` (unvalidated epochs,
    trainer.val_every_n_epochs > 1, have a null val_top1)."""
    return next((r["wall_time_s"] for r in rows if r["val_top1"] is not None and r["val_top1"] >= mark), None)


def read_rows(path: Path) -> list[dict]:
    """metrics.jsonl's rows; none when the run stopped before its first epoch ended. A last line cut
    short (a kill or a full disk while writing it) is left out, as a resume drops it."""
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                sys.exit(f"error: {path}: line {number} is not JSON")
    return rows


def _top1(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def span(values: list[float | None]) -> str:
    seen = [v for v in values if v is not None]
    if len(seen) < len(values):
        return "–" if not seen else f"{len(seen)}/{len(values)} runs"
    return f"{min(seen):.0f}–{max(seen):.0f} s" if len(seen) > 1 else f"{seen[0]:.0f} s"


def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.mean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")  # one run has no spread


def no_tta_column(no_tta: list[float], top1: list[float]) -> str:
    """Mean ± std of the unflipped top-1 when every completed seed validated with the flip; which
    share did when only some did (their top-1 mixes both kinds); "–" when none did."""
    if no_tta and len(no_tta) < len(top1):
        return f"{len(no_tta)}/{len(top1)} runs with the flip"
    return mean_std(no_tta)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run dirs (each with summary.json and metrics.jsonl)")
    parser.add_argument("--marks", type=float, nargs="+", default=[80, 85, 90], help="top-1 marks, %%")
    args = parser.parse_args(argv)
    groups: dict[str, list[Path]] = {}
    for run in args.runs:
        groups.setdefault(re.sub(r"_s\d+$", "", run.name), []).append(run)
    marks = " / ".join(f"{m:g}%" for m in args.marks)
    print(f"| recipe | top-1 per seed | mean ± std | without flip TTA | val_samples | wall time | to {marks} |")
    print("|---|---|---:|---:|---|---:|---:|")
    for name, runs in groups.items():
        missing = [str(r) for r in runs if not (r / "summary.json").is_file()]
        if missing:
            print(f"| {name} | no summary.json in {', '.join(missing)} | | | | | |")
            continue
        summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
        rows = [read_rows(r / "metrics.jsonl") for r in runs]
        # Only completed runs count: one stopped early (a signal, epochs_per_job) is shown, not averaged.
        done = [s.get("end_state") == "completed" and s.get("val_top1") is not None for s in summaries]
        top1 = [s["val_top1"] for s, d in zip(summaries, done, strict=True) if d]
        shown = [
            f"{s['val_top1']:.2f}" if d else f"{_top1(s.get('val_top1'))} ({s.get('end_state', 'no end_state')})"
            for s, d in zip(summaries, done, strict=True)
        ]
        # the unflipped pass's top-1 of runs that validated with trainer.val_flip_tta (the leaderboards' rules)
        no_tta = [s["val_top1_no_tta"] for s, d in zip(summaries, done, strict=True) if d and s.get("val_top1_no_tta") is not None]
        # Both time the run from its start over its jobs (summary.json from 2026-12-01; before, its last job only).
        wall = [max(s.get("wall_time_s") or 0.0, r[-1]["wall_time_s"] if r else 0.0) for s, r in zip(summaries, rows, strict=True)]
        reached = " / ".join(span([time_to(r, m) for r in rows]) for m in args.marks)
        print(
            f"| {name} | {', '.join(shown)} | {mean_std(top1)} | {no_tta_column(no_tta, top1)} | {sorted({s.get('val_samples') for s in summaries}, key=str)} "
            f"| {span(wall)} | {reached} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
