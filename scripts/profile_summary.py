#!/usr/bin/env python
"""Summarize a torch.profiler Chrome trace (from `scripts/benchmark.py --profile`): where GPU time goes.

Per CUDA stream: kernels, busy time and top kernels; for the window: GPU idle time, how much of the
model stream's idle time another stream (DALI's) was busy, and host time in `data wait` ranges.

    python scripts/profile_summary.py outputs/benchmark/profile/trace_resnet18_dali_compileoff.json.gz
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dali_train.profiling import load_events, summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="Chrome trace .json or .json.gz from torch.profiler")
    args = ap.parse_args()
    try:
        events = load_events(args.trace)
    except (OSError, ValueError, KeyError) as e:  # missing, not gzip/JSON, or no traceEvents
        ap.error(f"{args.trace}: not a readable torch.profiler Chrome trace ({type(e).__name__}: {e})")
    print(summarize(events))


if __name__ == "__main__":
    main()
