"""Do a GPU DALI train pipeline's threads and memory go away when the next epoch's replaces it
(train.py's pattern), and when a benchmark row's loaders are dropped mid-epoch (benchmark.py's)?
Prints, per step of each pattern: threads of the process, DALI reader threads, GPU memory in use
(nvidia-smi, which sees DALI's own allocations), host RSS. Usage: python check.py DATA_ROOT [DEVICE]."""
import gc
import os
import subprocess
import sys
import weakref

import torch
from hydra import compose, initialize_config_dir

from dali_train.config import load_config, register_configs
from dali_train.data import build_loaders
from dali_train.data.dali import DaliLoader
from dali_train.distributed import DistInfo
from dali_train.throughput import Endless

root, device = sys.argv[1], torch.device(sys.argv[2] if len(sys.argv) > 2 else "cuda:0")
register_configs()
overrides = [f"data.root={root}", "loader=dali" if device.type == "cuda" else "loader=dali_cpu", "loader.batch_size=256",
             "data.verify_files=false", f"trainer.device={device.type}"]
with initialize_config_dir(config_dir=os.path.abspath("conf"), version_base="1.3"):
    cfg = load_config(compose("config", overrides=overrides))
dist = DistInfo(0, 0, 1)
pipelines = weakref.WeakSet()  # every DALI pipeline built, for as long as something holds it
_build = DaliLoader._build


def build(self):
    iterator = _build(self)
    pipelines.add(iterator._pipes[0])
    return iterator


DaliLoader._build = build


def state(label: str) -> None:
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    gpu = "-"
    if device.type == "cuda":
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.split()
        gpu = f"{int(out[0]) / 1024:.2f} GiB"
    print(f"{label:<28} pipelines alive {len(pipelines)}  threads {len(names):>3}  reader threads {names.count('PrefetchWorker'):>2}  "
          f"GPU used {gpu}  host RSS {rss:.2f} GiB", flush=True)


def make():
    return build_loaders(cfg.data, cfg.loader, dist, device, half=True, channels_last=True, seed=0)


state("start")
loaders = make()
for epoch in range(6):  # train.py: one loader, the next epoch's pipeline replaces the last
    loaders.train.set_epoch(epoch)
    n = sum(1 for _ in loaders.train)
    state(f"train.py epoch {epoch} ({n} steps)")
del loaders
state("loaders dropped")
gc.collect()
state("after gc.collect()")
for row in range(4):  # benchmark.py: new loaders per row, left mid-epoch
    batches = Endless(make().train)
    for _ in range(3):
        next(batches)
    batches.close()
    del batches
    state(f"benchmark row {row}")
gc.collect()
state("after gc.collect()")
