"""Run directories: which one holds a run, and what a new run, a resume and an evaluation may do there.

A training in a dir where another process trains is refused (rank 0 of a training holds the dir's
flock, `training_lock`). A new training run (no trainer.resume, or another run's checkpoint) is
refused in a dir that holds a run, before Hydra's record could overwrite the run's: Hydra resolves `hydra.output_subdir` through `hydra_record_dir` (the
`${dali_train.hydra_record_dir:...}` resolver of conf/config.yaml), which sends that record apart,
and the task refuses (`refuse_new_run_over_run`), so a sweep loses one job, not the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import yaml
from hydra.core.hydra_config import HydraConfig

from dali_train.distributed import read_launch_env
from dali_train.errors import UserError

log = logging.getLogger(__name__)


def holds_a_run(run_dir: Path) -> bool:
    """Whether a training run wrote into run_dir: one that trained (its metrics or last checkpoint),
    or one whose summary.json says more than an error before training (a bad option, a missing
    folder: nothing to keep, and its corrected rerun goes into the same dir)."""
    if any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints/last.pt")):
        return True
    try:
        ended = json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # unreadable: kept as a run's
        return True
    # an error or out-of-memory refusal before any epoch (a bad option, a batch the startup check found too big)
    return not (ended.get("end_state") in ("error", "out of memory") and not ended.get("epochs_completed"))


EVAL_RECORD_DIR = ".hydra-eval"  # where an evaluation in a run's dir records its config
REFUSED_RECORD_DIR = ".hydra-refused"  # where a refused new run's record goes (removed when it is refused)


def resumes_another_run(run_dir: Path, resume: str | None) -> bool:
    """trainer.resume names a checkpoint outside run_dir/checkpoints/: another run's (samefile: a
    bind mount or a symlink may name this run's folder another way)."""
    if resume in (None, "auto"):
        return False
    try:
        return not os.path.samefile(Path(resume).parent, run_dir / "checkpoints")
    except OSError:  # either folder missing
        return True


def started_from(run_dir: Path) -> str | None:
    """The trainer.resume of the run in run_dir, as its config record has it (None: none, or no record)."""
    try:
        config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    return (config.get("trainer") or {}).get("resume")


def continues_its_run(run_dir: Path, resume: str | None) -> bool:
    """A later job of a run started from another run's checkpoint (a requeue, the next job of
    trainer.epochs_per_job, a torchrun restart): the same command, so the same trainer.resume, in a
    dir whose run was started with it and has a last.pt of its own, which it goes on from."""
    return (
        resumes_another_run(run_dir, resume)
        and (run_dir / "checkpoints" / "last.pt").is_file()
        and started_from(run_dir) == resume
    )


def _epoch_rows(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        return 0


def refusal(run_dir: Path, eval_only: bool, resume: str | None) -> str | None:
    """Why a training may not start in run_dir (None: it may). Refused, in a dir that holds a run:
    - a new run: no trainer.resume, or another run's checkpoint other than the one the dir's run
      started from (unless it `continues_its_run`); it would overwrite that run's config record and
      checkpoints and mix its log rows with the new run's (a rerun into the same folder, a SLURM
      requeue or a torchrun restart without resume=auto, trainer.resume=OTHER_RUN/.../last.pt);
    - going on (resume=auto, or the run's own start again) without the run's last.pt, where that
      would start over what must not be: more than one epoch logged (last.pt was removed: best.pt
      and the rows would be overwritten), or, with resume=auto, a run started from another run's
      checkpoint (random weights instead of it; refused even where nothing else of it is left, a
      kill in its first epoch). A run with at most one epoch logged and no last.pt (one killed or
      failed in its first epoch, or between its first best.pt and last.pt) starts over.
    Files no rank writes before all have joined."""
    if eval_only:
        return None
    last = run_dir / "checkpoints" / "last.pt"
    started = started_from(run_dir)  # a run killed in its first epoch leaves only this record
    if resume == "auto" and not last.is_file() and started not in (None, "auto") and resumes_another_run(run_dir, started):
        return (
            f"{run_dir}: its run started from trainer.resume={started} and saved no {last} yet; trainer.resume=auto "
            f"would start it over from random weights: run it again with trainer.resume={started}"
        )
    if not holds_a_run(run_dir):
        return None
    if resume not in (None, "auto") and not resumes_another_run(run_dir, resume):
        return None  # one of the run's own checkpoints (best.pt, say): it goes on from there
    if resume is None or (resume != "auto" and started != resume):
        new_run = f"to start from trainer.resume={resume}" if resume else "for a new run"
        return (
            f"{run_dir} holds a run already; continue it with trainer.resume=auto, or {new_run} use another "
            f"hydra.run.dir (hydra.sweep.dir in a sweep)"
        )
    if last.is_file():
        return None
    best = run_dir / "checkpoints" / "best.pt"
    go_on = f"to go on from its best.pt copy it to {last}, or " if best.is_file() else ""
    if (rows := _epoch_rows(run_dir)) > 1:
        return (
            f"{run_dir} holds {rows} epochs of a run but not its {last}, which each epoch writes: starting over "
            f"would overwrite its best.pt and logs; {go_on}use another hydra.run.dir"
        )
    return None


def refuses_new_run(run_dir: Path, eval_only: bool, resume: str | None) -> bool:
    return refusal(run_dir, eval_only, resume) is not None


TRAINING_LOCK = ".training.lock"  # flock'd by rank 0 of the run training in the dir, while it runs


def training_elsewhere(run_dir: Path) -> bool:
    """Whether another process is training in run_dir: it holds the dir's lock (`training_lock`).
    The kernel drops a flock when its process ends, SIGKILL included, so a crash leaves none."""
    try:
        with open(run_dir / TRAINING_LOCK, "rb") as probe:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no lock file (no run has trained here), or a file system without flock: not known
        return False
    return False


_held: IO[bytes] | None = None  # this process's open lock file while it trains


def _drop_in_forked_child() -> None:
    """A forked child (a loader worker, a process pool) shares the lock's open file: closing its
    copy leaves the lock with the parent, so the lock ends with the training, not with its workers."""
    global _held
    if _held is not None:
        _held.close()
        _held = None


os.register_at_fork(after_in_child=_drop_in_forked_child)


@contextlib.contextmanager
def training_lock(run_dir: Path, eval_only: bool) -> Iterator[None]:
    """Rank 0 of a training run holds run_dir's lock while it runs, so that a second training
    launched into the dir (a chain's next job submitted before this one ended, the same command
    twice) is refused (`check_new_run_dir`) instead of writing the same checkpoints and logs."""
    global _held
    handle = None
    if not eval_only and read_launch_env().rank == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            handle = open(run_dir / TRAINING_LOCK, "ab")  # noqa: SIM115 - held open for the run
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # taken since the check at the task's start
            handle.close()
            raise UserError(training_elsewhere_message(run_dir)) from None
        except OSError as e:  # an unwritable folder (the run says so itself), a file system without flock
            log.info("no training lock in %s (%s): a second training there would not be refused", run_dir, e)
            if handle is not None:
                handle.close()
            handle = None
    _held = handle
    try:
        yield
    finally:
        _held = None
        if handle is not None:
            handle.close()


def training_elsewhere_message(run_dir: Path) -> str:
    return (
        f"{run_dir}: another process is training in this folder (it holds {TRAINING_LOCK}); wait for it to end, "
        f"or use another hydra.run.dir (with none training there, as after a node crash on NFS: delete that file)"
    )


def check_new_run_dir(run_dir: Path, eval_only: bool, resume: str | None) -> None:
    """The UserError of `refusal` or `training_elsewhere`, from the task (a failed job in a
    sweep, not its end). The lock is rank 0's to check: another rank would see its own rank 0's."""
    if not eval_only and read_launch_env().rank == 0 and training_elsewhere(run_dir):
        raise UserError(training_elsewhere_message(run_dir))
    if (why := refusal(run_dir, eval_only, resume)) is not None:
        raise UserError(why)


def hydra_record_dir(eval_only: bool, output_dir: str, resume: str | None = None) -> str | None:
    """hydra.output_subdir, resolved before Hydra writes the record: an evaluation in a run's dir
    records its config beside the run's .hydra/, not over it (that one says what the run trained
    with), and so does a new run the task will refuse (`refuses_new_run`). A .hydra/ there is a
    run's, even one killed before its first metrics row. Rank 0 alone records (None: no record), so
    that no rank decides on a .hydra/ another rank of the same launch has just written."""
    if read_launch_env().rank != 0:
        return None
    run_dir = Path(output_dir)
    if refuses_new_run(run_dir, eval_only, resume) or (not eval_only and training_elsewhere(run_dir)):
        return REFUSED_RECORD_DIR
    return EVAL_RECORD_DIR if eval_only and (holds_a_run(run_dir) or (run_dir / ".hydra").is_dir()) else ".hydra"


def refuse_new_run_over_run(run_dir: Path, eval_only: bool, resume: str | None) -> None:
    """In the task: `check_new_run_dir`, with the refused run's record (.hydra-refused/, kept apart
    from the run's .hydra/) removed."""
    try:
        check_new_run_dir(run_dir, eval_only, resume)
    except UserError:
        if HydraConfig.get().output_subdir == REFUSED_RECORD_DIR:
            shutil.rmtree(run_dir / REFUSED_RECORD_DIR, ignore_errors=True)
        raise


def evaluates_a_run(run_dir: Path, eval_only: bool) -> bool:
    """An evaluation in a run's dir (trainer.resume=auto), which keeps that run's summary.json. Hydra
    has written its record by now: the record dir it chose says whether a run's .hydra/ was there."""
    return eval_only and (holds_a_run(run_dir) or (run_dir / EVAL_RECORD_DIR).is_dir())
