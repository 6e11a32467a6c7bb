"""Process-group setup and the few collectives the trainer needs.

The only module that reads the launcher's environment: torchrun (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT), SLURM's srun (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_JOB_NODELIST),
or nothing (one plain process). Everything else receives a `DistInfo`.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist


@dataclass(frozen=True)
class DistInfo:
    rank: int  # global rank: the DALI shard id
    local_rank: int  # rank on this node: the GPU index
    world_size: int  # number of processes: the DALI shard count

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _slurm_master_addr() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return out.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "127.0.0.1"


def read_launch_env() -> DistInfo:
    """Rank, local rank and world size from torchrun, srun, or a plain process (0, 0, 1)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistInfo(int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]))
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", 1)) > 1:
        # srun without torchrun: one task per GPU; derive what init_process_group("env://") reads.
        env.setdefault("MASTER_ADDR", _slurm_master_addr())
        env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", 0)) % 20000))
        info = DistInfo(int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"]))
        env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"] = str(info.rank), str(info.local_rank), str(info.world_size)
        return info
    return DistInfo(0, 0, 1)


def restart_count() -> int:
    """How many times torchrun (`--max-restarts`) has restarted this run's workers: 0 otherwise."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


RENDEZVOUS_QUIET_S = 10.0  # srun: a rank still waiting for the others after this says why (not every start)

# The launcher's rendezvous store, joined once per process and kept: under srun rank 0's copy is
# the server, which must outlive the stamp exchange until the group has joined through it.
_store: torch_dist.Store | None = None


def _rendezvous_store(info: DistInfo) -> torch_dist.Store:
    """The key-value store of torchrun's agent (or of rank 0 under srun), from MASTER_ADDR/PORT:
    CPU only, so the run stamp can be shared before the config is read and the group is joined."""
    global _store
    if _store is None:
        env = os.environ
        waiting: threading.Timer | None = None
        if "SLURM_PROCID" in env and "TORCHELASTIC_RUN_ID" not in env:  # srun: nothing else says why it waits
            waiting = threading.Timer(
                RENDEZVOUS_QUIET_S,
                print,
                [
                    f"[rank {info.rank}] still waiting for {info.world_size} processes at "
                    f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} (SLURM_NTASKS={env.get('SLURM_NTASKS')}: "
                    "start them with srun; one process alone: unset SLURM_NTASKS)"
                ],
                {"file": sys.stderr, "flush": True},
            )
            waiting.daemon = True
            waiting.start()
        try:
            _store, _, _ = next(torch_dist.rendezvous("env://", rank=info.rank, world_size=info.world_size))
        finally:
            if waiting is not None:
                waiting.cancel()
    return _store


def init_distributed() -> DistInfo:
    """Join the process group (idempotent). One plain process needs no group.

    With CUDA present the group has NCCL for CUDA tensors and gloo for CPU tensors, so the same
    group serves `trainer.device=cpu` runs. Call it after `set_cuda_max_connections`: joining an
    NCCL group starts CUDA, which fixes its queue count then (train.py measured 17.7k instead of
    23.4k img/s on two H200s when the variable came after); select_device picks the GPU.
    """
    info = read_launch_env()
    if info.world_size == 1 or torch_dist.is_initialized():
        return info
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.device_count() > 0 else "gloo"
    # Until the config is read; then trainer.dist_timeout_s applies (set_collective_timeout).
    torch_dist.init_process_group(
        backend=backend,
        # As torch's own init_method path, plus the attempt: a torchrun restart reuses the agent's
        # store, where the previous attempt's group keys (addresses, barrier counts) are stale.
        store=torch_dist.PrefixStore(f"default_pg/attempt_{restart_count()}", _rendezvous_store(info)),
        rank=info.rank,
        world_size=info.world_size,
        timeout=dt.timedelta(minutes=30),
    )
    return info


def set_collective_timeout(seconds: float, info: DistInfo) -> None:
    """How long a collective waits for the other ranks (a stopped or hung rank) before it fails.

    init_distributed joins with a 30-minute timeout before the typed config exists; train.py sets
    `trainer.dist_timeout_s` here.
    """
    if info.enabled:
        set_timeout = getattr(torch_dist, "set_timeout", None)  # public from torch 2.14; private before
        set_timeout = set_timeout or torch_dist.distributed_c10d._set_pg_timeout
        set_timeout(dt.timedelta(seconds=seconds))


def shared_run_stamp() -> str:
    """A `YYYY-MM-DD/HH-MM-SS.mmm_PID` stamp that all ranks agree on.

    Hydra resolves `${now:...}` in every process separately; ranks started a second apart would
    write to different run directories. Rank 0's clock decides; the others read it from the
    rendezvous store (no process group yet: the config, read later, sets CUDA up before one is
    joined). Rank 0's pid and the milliseconds keep two runs started in the same second apart.
    A torchrun restart (`--max-restarts`) reuses its agent's store, so it keeps the first attempt's
    stamp: the same run dir, where `trainer.resume=auto` finds the last checkpoint.
    """
    now = dt.datetime.now()
    stamp = f"{now:%Y-%m-%d/%H-%M-%S}.{now.microsecond // 1000:03d}_{os.getpid()}"
    info = read_launch_env()
    if not info.enabled:
        return stamp
    store = _rendezvous_store(info)
    key = "dali_train/run_stamp"
    if info.is_main:
        return store.compare_set(key, "", stamp).decode()  # set only by a run's first attempt
    return store.get(key).decode()


def all_gather_lists(items: list, info: DistInfo) -> list:
    """The concatenation of every rank's `items` (small lists: pickled over the CPU group)."""
    if not info.enabled:
        return items
    parts: list[list] = [[] for _ in range(info.world_size)]
    torch_dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """In-place sum across ranks (a GPU sync point when the tensor is on CUDA)."""
    if info.enabled:
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(value: float, info: DistInfo) -> float:
    """The largest `value` of all ranks (a CPU collective)."""
    if not info.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
    return tensor.item()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        torch_dist.barrier()


def _ending_key(rank: int) -> str:
    return f"dali_train/attempt_{restart_count()}/ended/{rank}"


def post_ending(info: DistInfo, state: str, exit_code: int, message: str) -> None:
    """This rank's ending, where rank 0 can read it: when another rank ends first, rank 0 (which
    writes summary.json) sees only its own collective fail ("Connection closed by peer")."""
    if not info.enabled:
        return
    try:
        _rendezvous_store(info).set(_ending_key(info.rank), f"{state}\t{exit_code}\t{message}")
    except Exception as e:  # noqa: BLE001 - the store gone too: this rank's log still says it
        print(f"[rank {info.rank}] could not post its ending: {e}", file=sys.stderr)


def posted_ending(info: DistInfo, wait_s: float = 2.0, *, not_causes: tuple[str, ...] = ()) -> tuple[int, str, int, str] | None:
    """(rank, state, exit code, message) of another rank's posted ending, waiting up to `wait_s`
    for one (it posts before it exits, and its exit is what failed this rank's collective). States
    in `not_causes` (another rank that only waited, as this one did) are passed over. None when
    none was posted, or the store is gone (under srun it lives in rank 0's process)."""
    if not info.enabled:
        return None
    try:
        store, deadline = _rendezvous_store(info), time.monotonic() + wait_s
        while True:
            for rank in range(info.world_size):
                if rank != info.rank and store.check([_ending_key(rank)]):
                    state, code, message = store.get(_ending_key(rank)).decode().split("\t", 2)
                    if state not in not_causes:
                        return rank, state, int(code), message
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - in an error path: this rank's own ending stands
        return None


def shutdown() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)  # SIGUSR2: SLURM's --signal, submitit's


class StopFlag:
    """Set by SIGTERM/SIGINT/SIGUSR2; the loop finishes its step, saves last.pt and exits. A handler
    that was there before (submitit's requeue on SIGUSR2) is kept, to be run once last.pt is saved.
    The flag of a multirun's previous job hands on its signal: one that came after that job's last
    check (its final validation, say) stops the next job before it starts."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._before: dict[int, Any] = {}

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            before = signal.getsignal(sig)
            previous_job = getattr(before, "__self__", None)
            if isinstance(previous_job, StopFlag):
                self.signal = self.signal or previous_job.signal
                if sig in previous_job._before:
                    self._before[sig] = previous_job._before[sig]
            elif callable(before) and before is not signal.default_int_handler:  # that one raises KeyboardInterrupt
                self._before[sig] = before
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def hand_over(self) -> None:
        """Run the handler the received signal had before install (submitit's requeue), if any."""
        before = self._before.get(self.signal)
        if before is not None:
            before(self.signal, None)

    def agreed(self, dist: DistInfo, device: torch.device) -> bool:
        """True on all ranks if any rank was signalled (a collective: call at the same step on all)."""
        flag = torch.tensor([0.0 if self.signal is None else 1.0], device=device)
        return bool(all_reduce_sum(flag, dist).item() > 0)

    def requested(self, dist: DistInfo, device: torch.device, *, sync_point: bool) -> bool:
        """Whether to stop now. One process decides alone, at any step; several ranks decide together
        (a collective), only at sync points, which every rank reaches at the same step."""
        if not dist.enabled:
            return self.signal is not None
        return sync_point and self.agreed(dist, device)
