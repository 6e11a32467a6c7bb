"""Summary of a torch.profiler Chrome trace (from `scripts/benchmark.py --profile`): where GPU time goes.

For each CUDA stream: kernel and copy count, busy time (union of its intervals) and its top kernels;
for the whole window: how much of the time no stream ran anything, how much of the model stream's
idle time another stream (DALI's) was busy, and how long the host sat in `data wait` ranges. It
answers "is the GPU starved, or busy with loader work?" without a trace viewer
(`scripts/profile_summary.py TRACE` prints it).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the overlap of two merged, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def summarize(events: list[dict]) -> str:
    by_stream: dict[int, list[dict]] = defaultdict(list)
    data_wait, api_calls = [], []
    main_tid = None
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in GPU_CATS:
            by_stream[int(e.get("args", {}).get("stream", -1))].append(e)
        elif e.get("name") == "data wait" and e.get("cat") == "user_annotation":
            data_wait.append((e["ts"], e["ts"] + e["dur"]))
            main_tid = e.get("tid")
        elif e.get("cat") in ("cuda_runtime", "cuda_driver"):
            api_calls.append(e)
    if not by_stream:
        return "no GPU activity in the trace (CPU-only run?)"
    busy = {s: _union([(e["ts"], e["ts"] + e["dur"]) for e in evs]) for s, evs in by_stream.items()}
    start = min(iv[0][0] for iv in busy.values())
    end = max(iv[-1][1] for iv in busy.values())
    window = end - start
    model_stream = max(busy, key=lambda s: _length(busy[s]))
    everything = _union([iv for ivs in busy.values() for iv in ivs])
    others = _union([iv for s, ivs in busy.items() if s != model_stream for iv in ivs])
    model_gaps = []  # model-stream idle intervals inside the window
    prev = start
    for a, b in busy[model_stream]:
        if a > prev:
            model_gaps.append((prev, a))
        prev = b
    if end > prev:  # the window's tail, after the model stream's last kernel
        model_gaps.append((prev, end))
    lines = [
        f"window {window / 1e3:.1f} ms (first to last GPU activity); GPU idle (no stream busy) "
        f"{(window - _length(everything)) / 1e3:.1f} ms = {1 - _length(everything) / window:.1%}",
        f"model stream {model_stream}: busy {_length(busy[model_stream]) / window:.1%}; its idle time "
        f"{_length(model_gaps) / 1e3:.1f} ms, of which other streams busy {_intersect(model_gaps, others) / 1e3:.1f} ms; "
        f"other streams overlap the model stream for {_intersect(busy[model_stream], others) / 1e3:.1f} ms",
        f"model-stream gaps > 0.2 ms: {sum(1 for a, b in model_gaps if b - a > 200)}, "
        f"longest {max((b - a for a, b in model_gaps), default=0) / 1e3:.2f} ms",
    ]
    if data_wait:
        lines.append(f"host in 'data wait': {_length(_union(data_wait)) / 1e3:.1f} ms in {len(data_wait)} ranges")
    # CUDA API calls per host thread: who launches how much, and who blocks in synchronizations.
    per_thread: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in api_calls:
        kind = "sync" if "ynchronize" in e["name"] else "launch" if "Launch" in e["name"] else "other"
        who = "main" if e.get("tid") == main_tid else f"thread {e.get('tid')}"
        per_thread[(who, kind if kind != "sync" else e["name"])].append(e["dur"])
    for (who, kind), durs in sorted(per_thread.items(), key=lambda kv: -sum(kv[1]))[:8]:
        lines.append(f"CUDA API {who}: {kind} x{len(durs)}, {sum(durs) / 1e3:.1f} ms")
    for s in sorted(busy, key=lambda s: -_length(busy[s])):
        evs = by_stream[s]
        per_name: dict[str, float] = defaultdict(float)
        for e in evs:
            per_name[e["name"]] += e["dur"]
        top = sorted(per_name.items(), key=lambda kv: -kv[1])[:5]
        lines.append(
            f"stream {s}: {len(evs)} kernels/copies, busy {_length(busy[s]) / 1e3:.1f} ms "
            f"({_length(busy[s]) / window:.1%}); top: " + "; ".join(f"{name[:60]} {t / 1e3:.1f} ms" for name, t in top)
        )
    return "\n".join(lines)
