"""Run under torchrun: build this rank's loaders through the app and record the labels it reads.

    torchrun ... tests/helpers/shard_probe.py DATA_ROOT OUT_DIR
Writes OUT_DIR/rank<global rank>.json: {"train": [...], "val": [...], "world_size": N}.
"""

import json
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dali_train.config import load_config, register_configs  # noqa: E402
from dali_train.data import build_loaders  # noqa: E402
from dali_train.distributed import init_distributed, shutdown  # noqa: E402

root, out = sys.argv[1], Path(sys.argv[2])
dist = init_distributed()
register_configs()
with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
    cfg = load_config(compose(
        "config",
        overrides=[
            "data=imagenet",
            f"data.root={root}",
            "loader=dali_cpu",
            "loader.batch_size=4",
            "loader.num_threads=1",
            "data.train_size=32",
            "data.val_resize=32",
            "data.val_size=32",
        ],
    ))
loaders = build_loaders(cfg.data, cfg.loader, dist, torch.device("cpu"), half=False, channels_last=False, seed=cfg.seed)
loaders.train.set_epoch(0)
train = [int(x) for _, labels in loaders.train for x in labels]
val = [int(x) for _, labels in loaders.val for x in labels]
(out / f"rank{dist.rank}.json").write_text(json.dumps({"train": train, "val": val, "world_size": dist.world_size}))
shutdown()
