"""dali-train: ImageNet-style training with GPU JPEG decoding (NVIDIA DALI), configured by Hydra.

    python train.py                                        # demo: sample data, CPU or GPU
    torchrun --nproc_per_node=8 train.py loader=dali model=resnet50 data=imagenet data.root=/data/imagenet
    torchrun --nproc_per_node=2 train.py trainer.device=cpu    # gloo, for testing
    python train.py -m optimizer.lr=0.05,0.1,0.2               # a Hydra sweep
    python train.py trainer.eval_only=true trainer.resume=outputs/.../checkpoints/best.pt

`run(cfg)` reads top to bottom: distributed + logging, the typed config (every value checked), data,
model, optimizer, restore, then the epochs (`dali_train.fit.Fit`), summary. It returns the best val top-1, the objective of
Hydra sweepers. This is the only place that sees the whole config: the builders of dali_train/
receive its typed parts and explicit values, by keyword.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dali_train.checkpoint import Checkpointer, CheckpointMeta
from dali_train.config import load_config, register_configs
from dali_train.config_errors import (
    check_experiment_choice,
    composition_error_line,
    refuse_keys_past_the_schema,
    require_values,
)
from dali_train.data import build_loaders
from dali_train.device import amp_dtype_for, configure_backends, select_device, set_cuda_max_connections
from dali_train.distributed import (
    DistInfo,
    StopFlag,
    barrier,
    init_distributed,
    post_ending,
    posted_ending,
    read_launch_env,
    restart_count,
    set_collective_timeout,
    shared_run_stamp,
    shutdown,
)
from dali_train.ending import EXIT_USER, Ending, RunShape, ending_for, stopped_by_signal
from dali_train.engine import updates_per_epoch
from dali_train.errors import UserError, print_error
from dali_train.fit import Fit
from dali_train.logs import MetricsWriter, setup_logging
from dali_train.model_inputs import check_input_sides, check_largest_crop_fits, run_input_sides
from dali_train.parts import build_train_parts
from dali_train.resume_fit import check_evaluated_classes
from dali_train.run_dirs import continues_its_run, evaluates_a_run, refuse_new_run_over_run, training_lock
from dali_train.sweep import write_sweep_summary

log = logging.getLogger("dali_train")


class RunEnded(Exception):
    """A run that did not complete; `main` turns it into its exit code (and one `error:` line)."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.message)
        self.ending = ending


def run(cfg: DictConfig) -> float:
    """Train (or evaluate) per `cfg`; returns the best val top-1. Every ending, failures included,
    is written to summary.json's `end_state`; one with a non-zero exit code raises RunEnded."""
    cuda_queues = set_cuda_max_connections(cfg.trainer.cuda_max_connections)  # before anything starts CUDA
    dist = init_distributed()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    setup_logging(dist, run_dir)
    log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))  # as the run sees it (paths, interpolations)
    log.info("CUDA_DEVICE_MAX_CONNECTIONS=%s", cuda_queues or "unset (CUDA's default, 8)")
    summary_name = "eval_summary.json" if evaluates_a_run(run_dir, cfg.trainer.eval_only) else "summary.json"
    writer = MetricsWriter(run_dir, dist.is_main, summary_name)
    summary: dict = {"world_size": dist.world_size, "loader": cfg.loader.name, "model": cfg.model.name}
    started = time.perf_counter()
    try:
        ending = train(cfg, dist, run_dir, writer, summary)
    except Exception as e:
        shape = RunShape(cfg.model.name, cfg.loader.batch_size, cfg.trainer.grad_accum_steps, summary.get("device"))
        ending = ending_for(e, shape, cfg.trainer.dist_timeout_s, training="epochs_completed" in summary)
        if ending is not None:
            post_ending(dist, ending.state, ending.exit_code, ending.message)
        if dist.enabled and (ending is None or ending.state == "collective timed out"):
            # another rank's ending reaches this one as a failed or timed-out collective: say its cause
            if (posted := posted_ending(dist, not_causes=("collective timed out",))) is not None:
                rank, state, code, message = posted
                ending = Ending(state, code, f"rank {rank}: {message}")
        if ending is None:  # a bug: its traceback follows from Hydra
            end_run(writer, summary, Ending("crashed", 1, f"{type(e).__name__}: {e}"), started)
            raise
        end_run(writer, summary, ending, started)
        raise RunEnded(ending) from None
    end_run(writer, summary, ending, started)
    if ending.hand_over is not None:  # last.pt and summary.json are written: submitit may requeue now
        ending.hand_over()
    if ending.exit_code:
        raise RunEnded(ending)
    barrier(dist)
    return summary["best_val_top1"]


def end_run(writer: MetricsWriter, summary: dict, ending: Ending, started: float) -> None:
    """summary.json with `end_state`, and the last log line: how the run ended. `wall_time_s` runs
    from the run's start over all its jobs, as metrics.jsonl's; `job_wall_time_s` is this job's."""
    job_s = time.perf_counter() - started
    summary.update(end_state=ending.state, wall_time_s=writer.earlier_jobs_s + job_s, job_wall_time_s=job_s)
    if ending.message:
        summary["end_message"] = ending.message
    device = summary.get("device")
    summary["device"] = None if device is None else str(device)  # null before one was chosen ("None" was)
    try:  # strict JSON: a best top-1 of -inf (nothing validated yet) is null (logs.json_text)
        writer.summary(summary)
        writer.close()
    except OSError as e:  # a full disk, say: the ending itself still reaches the log and the exit code
        log.warning("could not write summary.json: %s", e)
    if ending.exit_code:
        (log.warning if ending.exit_code > 128 else log.error)("run ended: %s: %s", ending.state, ending.message)
    elif ending.message:
        log.info("%s: %s", ending.state, ending.message)


def train(cfg: DictConfig, dist: DistInfo, run_dir: Path, writer: MetricsWriter, summary: dict) -> Ending:
    c = load_config(cfg)  # typed, every value checked: a UserError names the key
    tc = c.trainer
    set_collective_timeout(tc.dist_timeout_s, dist)
    device = select_device(tc.device, dist)
    summary["device"] = device
    amp_dtype = amp_dtype_for(tc.amp, device)
    configure_backends(device, deterministic=tc.deterministic, cudnn_benchmark=tc.cudnn_benchmark, tf32=tc.tf32)
    stop = StopFlag()
    stop.install()
    if stop.requested(dist, device, sync_point=True):  # it came after the previous job's last check
        signum = stop.signal or signal.SIGTERM
        return stopped_by_signal(signum, f"signal {signum} came as the previous job ended: nothing run", stop.hand_over)

    # Data, the checkpoint to restore if any, then the model and its optimizer.
    loaders = build_loaders(
        c.data, c.loader, dist, device, half=amp_dtype is not None, channels_last=tc.channels_last, seed=c.seed
    )
    upe = updates_per_epoch(len(loaders.train), tc.max_steps_per_epoch, tc.grad_accum_steps)
    global_batch = c.loader.batch_size * dist.world_size * tc.grad_accum_steps
    summary.update(epochs=tc.epochs, global_batch=global_batch)
    meta = CheckpointMeta(
        model_name=c.model.name,
        optimizer_name=c.optimizer.name,
        batch_size=c.loader.batch_size,
        world_size=dist.world_size,
        grad_accum_steps=tc.grad_accum_steps,
        updates_per_epoch=upe,
        train_files=len(loaders.dataset.train.files) if loaders.dataset is not None else 0,
        classes=list(loaders.dataset.classes) if loaders.dataset is not None else [],
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    checkpointer = Checkpointer(run_dir, dist, meta)
    continuing = not tc.eval_only and continues_its_run(run_dir, tc.resume)  # a later job: its own last.pt
    resume = checkpointer.resolve("auto" if continuing else tc.resume)
    if tc.eval_only and not resume and not c.model.pretrained:
        raise UserError(
            f"trainer.eval_only=true trainer.resume={tc.resume}: no {checkpointer.path('last.pt')}, nothing to evaluate"
        )
    parts = build_train_parts(
        c.model,
        c.optimizer,
        c.scheduler,
        tc,
        seed=c.seed,
        dist=dist,
        device=device,
        num_classes=loaders.num_classes,
        updates_per_epoch=upe,
        global_batch=global_batch,
        amp_dtype=amp_dtype,
        restoring=resume,  # its weights replace model.pretrained's: that file is not read (a requeue may lack it)
    )
    if tc.eval_only and not resume and c.model.pretrained:
        check_evaluated_classes(c.model.pretrained, meta)
    sides = run_input_sides(c.data, epochs=tc.epochs, eval_only=tc.eval_only, progressive=c.loader.name != "synthetic")
    check_input_sides(parts.model, c.model.name, sides)

    # Restore: the schedule is the current config's, positioned at the checkpoint's step.
    if not tc.eval_only:  # its temp-file cleanup could delete a checkpoint a running trainer is writing
        checkpointer.prepare(parts)
    start_epoch, start_step, best_top1 = 0, 0, float("-inf")
    if resume:
        state = checkpointer.restore(resume, parts, eval_only=tc.eval_only)
        start_epoch, start_step, best_top1 = state.next_epoch, state.next_step, state.best_top1
        log.info("resumed from %s at epoch %d step %d (best top-1 %.2f)", resume, start_epoch, start_step, best_top1)
    elif restart_count():
        log.warning("torchrun restart %d with trainer.resume=%s: training starts over", restart_count(), tc.resume)
    elif tc.resume == "auto" and not tc.eval_only:  # a first job, or a rerun that missed its run's dir
        log.info("trainer.resume=auto: no %s yet, so training starts at epoch 0", checkpointer.path("last.pt"))
    if not tc.eval_only and c.loader.name != "synthetic":  # after the restore: its optimizer state takes memory too
        check_largest_crop_fits(
            parts, c.model.name, c.data, epochs=tc.epochs, start_epoch=start_epoch, batch_size=c.loader.batch_size,
            channels_last=tc.channels_last, compiled=tc.compile,
        )  # fmt: skip
    if not tc.eval_only:  # an evaluation in the training run's dir leaves its logs alone
        writer.drop_after(start_epoch, parts.global_step, start_step)  # rows logged after the checkpoint: redone now
        if resume and state.wall_time_s is not None:
            writer.earlier_jobs_s = state.wall_time_s  # the run's time at the save: a mid-epoch one's part epoch too
    summary["best_val_top1"] = best_top1
    fit = Fit(parts, loaders, checkpointer, writer, stop, tc, c.loader.name, summary, best_top1=best_top1)
    return fit.run(start_epoch, start_step)


_task_started = False  # composition errors happen before it; see __main__
_failed_jobs: list[str] = []  # a multirun's jobs that ended with an error, for its exit code
_failed_jobs_dir: list[str] = []  # their sweep dir


class TrialFailed(Exception):
    """A failed job of an Optuna search, raised to its sweeper, which records a failed trial."""


def _end_job(code: int, message: str) -> float:
    """A run that ended with an error: exit with its code, except in a one-process multirun, where
    the other jobs still run and the sweep exits with the code at its end: the job returns NaN to
    Hydra's basic sweeper (which would stop at a raised job) and raises TrialFailed to Optuna's
    (whose tell() raises on a NaN). A signal (preemption) or a multi-process job still ends the sweep."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if not (multirun and code == EXIT_USER and not read_launch_env().enabled):
        shutdown()
        sys.exit(code)
    _failed_jobs.append(f"job {HydraConfig.get().job.num}: {message}")
    _failed_jobs_dir[:] = [HydraConfig.get().sweep.dir]
    if "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")):
        raise TrialFailed(message)
    return float("nan")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    global _task_started
    _task_started = True
    try:
        check_experiment_choice(HydraConfig.get().runtime.choices.get("experiment"))
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        refuse_new_run_over_run(run_dir, cfg.trainer.eval_only, cfg.trainer.resume)
        refuse_keys_past_the_schema(cfg)  # a `+key` no schema has: before run() logs it
        require_values(cfg)  # before run() logs the resolved config
        with training_lock(run_dir, cfg.trainer.eval_only):
            return run(cfg)
    except UserError as e:  # before the run dir: no summary
        log.error("%s", e)
        print_error(str(e))
        return _end_job(EXIT_USER, str(e))
    except RunEnded as e:
        if e.ending.exit_code == EXIT_USER:
            print_error(e.ending.message)
        return _end_job(e.ending.exit_code, e.ending.message)
    except Exception as e:  # a bug; Optuna's sweeper (max_failure_rate 1.0) would keep only its message
        if HydraConfig.initialized() and "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")):
            log.exception("job %s crashed", HydraConfig.get().job.num)
            _failed_jobs.append(f"job {HydraConfig.get().job.num} crashed: {type(e).__name__}: {e}")
            _failed_jobs_dir[:] = [HydraConfig.get().sweep.dir]
        raise


if __name__ == "__main__":
    # What the imports made (torch, timm, Hydra: ~400k objects) lives as long as the process: frozen
    # out of the cycle collector's view, the full collections of the run and of the interpreter's
    # exit skip it (a short CPU run: 4.7 -> 3.5 s of CPU), and a forked loader worker's collections
    # leave those pages shared. Once per process: one that froze its own (the tests, which run this
    # file in-process too) keeps it.
    if not gc.get_freeze_count():
        gc.freeze()
    register_configs()
    atexit.register(shutdown)  # after all jobs: a multirun reuses the process group between jobs
    # All ranks must write to one run dir: rank 0's timestamp, shared before Hydra resolves it.
    os.environ["DALI_TRAIN_RUN_STAMP"] = shared_run_stamp()
    # Hydra prints a composition error (an unknown key, a key of another option, a wrong type, a
    # bad override) in several lines and exits 1. With HYDRA_FULL_ERROR it raises it instead: we
    # print it as one `error:` line with a UserError's code, 2. Set HYDRA_FULL_ERROR=1 yourself to
    # get Hydra's traceback instead.
    hydra_traceback = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except Exception as e:
        if _failed_jobs and "No trials are completed" in str(e):  # Optuna's end when every trial failed
            write_sweep_summary(_failed_jobs_dir[0])
        elif _task_started or hydra_traceback:  # a bug in the run: its traceback follows
            raise
        else:
            print_error(composition_error_line(e))
            sys.exit(EXIT_USER)
    if _failed_jobs:  # a multirun whose every job ran, some with an error
        print_error(f"{len(_failed_jobs)} job(s) of the sweep failed; " + "; ".join(_failed_jobs))
        sys.exit(EXIT_USER)
