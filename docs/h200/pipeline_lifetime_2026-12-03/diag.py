"""Why did Endless.close() not shut a GPU pipeline down? Instrumented patterns, run once on the H200
host (Python 3.12.3, torch 2.11, DALI 2.4) with the fixed Endless in the tree: B is Endless as it was
at da72be1 (closes only its outer generator), E is the fixed one (closes the loader's pass by name),
F is the same nesting in plain Python. Output: diag.txt; check.py of 2026-12-02 after it: lifetime.txt."""

import gc
import itertools
import os
import sys
import weakref

import nvidia.dali as dali
import torch
from hydra import compose, initialize_config_dir

from dali_train.config import load_config, register_configs
from dali_train.data import build_loaders
from dali_train.data.dali import DaliLoader
from dali_train.distributed import DistInfo
from dali_train.throughput import Endless


class OldEndless:  # Endless as at da72be1
    def __init__(self, loader, hold=0):
        self.loader, self.switch_s = loader, []
        self.left = None
        self._batches = self._generate()

    def _generate(self):
        for epoch in itertools.count():
            self.loader.set_epoch(epoch)
            self.left = len(self.loader)
            for batch in self.loader:
                self.left -= 1
                yield batch

    def __next__(self):
        return next(self._batches)

    def close(self):
        self._batches.close()


print("python", sys.version.split()[0], "torch", torch.__version__, "dali", dali.__version__, flush=True)
root, device = sys.argv[1], torch.device(sys.argv[2])
register_configs()
ov = [
    f"data.root={root}",
    "loader=dali" if device.type == "cuda" else "loader=dali_cpu",
    "loader.batch_size=256",
    "data.verify_files=false",
    f"trainer.device={device.type}",
]
with initialize_config_dir(config_dir=os.path.abspath("conf"), version_base="1.3"):
    cfg = load_config(compose("config", overrides=ov))
dist = DistInfo(0, 0, 1)
pipes = weakref.WeakSet()
_build, _drop = DaliLoader._build, DaliLoader._drop_pipeline


def build(self):
    it = _build(self)
    pipes.add(it._pipes[0])
    return it


def drop(self, iterator=None):
    early = iterator is not None and iterator is not self._iterator
    print(
        f"    _drop_pipeline(iterator={'given' if iterator is not None else 'None'}) early_return={early} pipe={'set' if self._pipe is not None else 'None'}",
        flush=True,
    )
    return _drop(self, iterator)


DaliLoader._build, DaliLoader._drop_pipeline = build, drop


def threads():
    return len(os.listdir("/proc/self/task"))


def state(label):
    print(f"{label:<40} pipelines alive {len(pipes)} threads {threads()}", flush=True)


def make():
    return build_loaders(cfg.data, cfg.loader, dist, device, half=True, channels_last=True, seed=0)


state("start")
print("A: direct iter/close", flush=True)
ld = make().train
ld.set_epoch(0)
g = iter(ld)
next(g)
next(g)
g.close()
state("A after close")
del g, ld
state("A after del")
gc.collect()
state("gc")
print("B: OldEndless close", flush=True)
for row in range(3):
    b = OldEndless(make().train)
    for _ in range(3):
        next(b)
    b.close()
    state(f"B row {row} after close")
    del b
    state(f"B row {row} after del")
gc.collect()
state("gc")
print("C: Endless, gc disabled", flush=True)
gc.disable()
b = OldEndless(make().train)
for _ in range(3):
    next(b)
b.close()
state("C after close")
frame = b._batches.gi_frame
print(
    "   gen frame",
    frame,
    "suspended",
    b._batches.gi_suspended if hasattr(b._batches, "gi_suspended") else "?",
    flush=True,
)
del b
state("C after del")
gc.enable()
gc.collect()
state("gc")
print("D: Endless, inner pass found via gc.get_referrers", flush=True)
b = OldEndless(make().train)
for _ in range(3):
    next(b)
inner = (
    [o for o in gc.get_referents(b._batches.gi_frame) if type(o).__name__ == "generator"] if b._batches.gi_frame else []
)
print("   inner generators referenced by the frame:", len(inner), flush=True)
b.close()
print(
    "   inner referrers after close:",
    [type(r).__name__ for r in gc.get_referrers(*inner)] if inner else "-",
    "refcount",
    sys.getrefcount(inner[0]) if inner else "-",
    flush=True,
)
if inner:
    print("   inner frame", inner[0].gi_frame, flush=True)
state("D after close")
del inner
state("D after del inner")
del b
gc.collect()
state("gc")
print("E: new Endless close", flush=True)
for row in range(3):
    b = Endless(make().train)
    for _ in range(3):
        next(b)
    b.close()
    state(f"E row {row} after close")
    del b
    state(f"E row {row} after del")
print("F: gen close fast path probe", flush=True)
closed = []


def inner():
    try:
        yield 1
        yield 2
    finally:
        closed.append(1)


def outer():
    for _ in itertools.count():
        for y in inner():  # noqa: UP028 -- the nesting Endless._generate has
            yield y


o = outer()
next(o)
o.close()
print("   inner finalized at outer close:", bool(closed), flush=True)
