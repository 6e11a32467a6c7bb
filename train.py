"""dali-train: ImageNet-style training with GPU JPEG decoding (NVIDIA DALI), configured by Hydra.

    python train.py                                        # demo: sample data, CPU or GPU
    torchrun --nproc_per_node=8 train.py loader=dali model=resnet50 data=imagenet data.root=/data/imagenet
    torchrun --nproc_per_node=2 train.py trainer.device=cpu    # gloo, for testing
    python train.py -m optimizer.lr=0.05,0.1,0.2               # a Hydra sweep
    python train.py trainer.eval_only=true trainer.resume=outputs/.../checkpoints/best.pt

`run(cfg)` reads top to bottom: distributed + logging, checks, data, model, optimizer, restore,
epoch loop, summary. It returns the best val top-1, the objective of Hydra sweepers.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dali_train import checkpoint as ckpt
from dali_train.config import register_configs
from dali_train.data import DatasetError, build_loaders
from dali_train.distributed import barrier, init_distributed, shared_run_stamp, shutdown
from dali_train.engine import LoopControl, StopFlag, evaluate, train_one_epoch
from dali_train.errors import UserError
from dali_train.logs import MetricsWriter, input_bound_verdict, setup_logging
from dali_train.runtime import (
    amp_dtype_for,
    build_train_parts,
    check_options,
    configure_backends,
    select_device,
    set_cuda_max_connections,
)

log = logging.getLogger("dali_train")


def run(cfg: DictConfig) -> float:
    cuda_queues = set_cuda_max_connections(cfg.trainer.cuda_max_connections)  # before anything starts CUDA
    dist = init_distributed()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    setup_logging(dist, run_dir)
    log.info("config:\n%s", OmegaConf.to_yaml(cfg))
    log.info("CUDA_DEVICE_MAX_CONNECTIONS=%s", cuda_queues or "unset (CUDA's default, 8)")
    check_options(cfg)
    tc = cfg.trainer
    device = select_device(tc.device, dist)
    amp_dtype = amp_dtype_for(tc.amp, device)
    configure_backends(device, deterministic=tc.deterministic, cudnn_benchmark=tc.cudnn_benchmark)
    stop = StopFlag()
    stop.install()

    # Data, then the model and its optimizer (runtime.build_train_parts keeps the wrap order).
    loaders = build_loaders(cfg, dist, device, half=amp_dtype is not None)
    parts = build_train_parts(cfg, dist, device, num_classes=loaders.num_classes, loader_steps=len(loaders.train))
    model, ema, optimizer = parts.model, parts.ema, parts.optimizer
    global_batch = cfg.loader.batch_size * dist.world_size * tc.grad_accum_steps

    # Restore.
    start_epoch, start_step, best_top1 = 0, 0, float("-inf")
    resume = ckpt.resolve_resume(tc.resume, run_dir)
    if resume:
        state = ckpt.restore(resume, parts, cfg.model.name)
        start_epoch, start_step, best_top1 = state["next_epoch"], state["next_step"], state["best_top1"]
        log.info("resumed from %s at epoch %d step %d (best top-1 %.2f)", resume, start_epoch, start_step, best_top1)

    def save(name: str, epoch: int, step: int) -> None:
        ckpt.save(
            run_dir / "checkpoints" / name, parts, dist, cfg, next_epoch=epoch, next_step=step, best_top1=best_top1
        )

    writer = MetricsWriter(run_dir, dist.is_main)
    ctl = LoopControl(
        writer,
        tc.log_every_n_steps,
        tc.max_steps_per_epoch,
        tc.save_every_n_steps,
        lambda e, s: save("last.pt", e, s),
        stop,
    )
    eval_model = ema.module if ema is not None else model  # best is tracked on EMA when it is on

    def exit_on_signal(where: str) -> None:
        log.warning("stopped by signal %s %s; saved %s", stop.signal, where, run_dir / "checkpoints" / "last.pt")
        writer.close()
        shutdown()
        sys.exit(128 + (stop.signal or signal.SIGTERM))

    def validate() -> dict:
        return evaluate(
            eval_model, loaders.val, device=device, dist=dist, amp_dtype=amp_dtype, max_steps=tc.max_val_steps
        )

    started, epoch_stats, metrics = time.perf_counter(), [], {}
    end_epoch = tc.epochs if tc.epochs_per_job is None else min(tc.epochs, start_epoch + tc.epochs_per_job)
    epochs = range(start_epoch, start_epoch if tc.eval_only else end_epoch)
    for epoch in epochs:
        loaders.train.set_epoch(epoch, start_step)
        updates_before = parts.global_step
        try:
            stats = train_one_epoch(parts, loaders.train, ctl, epoch=epoch, start_step=start_step)
        except DatasetError:  # a file the startup check let through; keep what was trained
            if not dist.enabled:  # (other ranks may sit in a collective: the last periodic save stands)
                save("last.pt", epoch, start_step + (parts.global_step - updates_before) * tc.grad_accum_steps)
                log.warning("saved %s before stopping", run_dir / "checkpoints" / "last.pt")
            raise
        if stats.interrupted:
            save("last.pt", epoch, start_step + stats.steps)
            exit_on_signal(f"at epoch {epoch} step {start_step + stats.steps}")
        start_step = 0
        if epoch + 1 < end_epoch:
            loaders.train.set_epoch(epoch + 1)  # the next pipeline builds and prefetches during val
        metrics = validate()
        best_top1 = max(best_top1, metrics["top1"])
        epoch_stats.append(stats)
        save("last.pt", epoch + 1, 0)
        if metrics["top1"] >= best_top1:
            save("best.pt", epoch + 1, 0)
        writer.log_epoch(epoch, stats, metrics, optimizer.param_groups[0]["lr"], parts.global_step)
        if epoch + 1 < end_epoch and stop.agreed(dist, device):
            exit_on_signal(f"after epoch {epoch}")

    if not epoch_stats:  # eval_only, or resumed after the last epoch
        metrics = validate()
        best_top1 = max(best_top1, metrics["top1"])
    if metrics["samples"] != loaders.num_val_files and tc.max_val_steps is None:
        log.warning("validation saw %d images, the val split has %d", metrics["samples"], loaders.num_val_files)
    img_s = sum(s.img_per_s for s in epoch_stats) / max(len(epoch_stats), 1)
    wait = sum(s.data_wait_frac for s in epoch_stats) / max(len(epoch_stats), 1)
    summary = {
        "val_top1": metrics["top1"],
        "val_top5": metrics["top5"],
        "val_loss": metrics["loss"],
        "best_val_top1": best_top1,
        "val_samples": metrics["samples"],
        "epochs": tc.epochs,
        "world_size": dist.world_size,
        "global_batch": global_batch,
        "train_img_s": img_s,
        "data_wait_frac": wait,
        "wall_time_s": time.perf_counter() - started,
        "loader": cfg.loader.name,
        "model": cfg.model.name,
        "device": str(device),
    }
    writer.summary(summary)
    writer.close()
    log.info(
        "done: val top-1 %.2f (best %.2f), top-5 %.2f on %d images; %s",
        metrics["top1"],
        best_top1,
        metrics["top5"],
        metrics["samples"],
        input_bound_verdict(wait, cfg.loader.name) if epoch_stats else "eval only",
    )
    barrier(dist)
    return best_top1


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    try:
        return run(cfg)
    except UserError as e:
        logging.getLogger("dali_train").error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    register_configs()
    atexit.register(shutdown)  # after all jobs: a multirun reuses the process group between jobs
    # All ranks must write to one run dir: rank 0's timestamp, shared before Hydra resolves it.
    os.environ["DALI_TRAIN_RUN_STAMP"] = shared_run_stamp()
    main()
