"""Shared fixtures: real JPEG folders on disk; train.run(cfg) in-process on the composed config
(`run_inprocess`), scripts and train.py's command line in-process (`run_script`), and train.py
as a subprocess (`run_train`) where a real interpreter's exit code, a signal or torchrun is the subject.

torch, train.py and the data package are imported where used: pytest-xdist's controller process
loads this file too, and runs no test (their ~5 s of imports there were a serial start)."""

from __future__ import annotations

import copy
import gc
import json
import logging
import os
import runpy
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict, read_write

from dali_train.config import register_configs
from dali_train.errors import UserError

REPO = Path(__file__).resolve().parents[1]
IMAGENETTE_MINI = REPO.parent / "shared" / "data" / "imagenette-mini"
LAUNCHER_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "GROUP_RANK",
    "DALI_TRAIN_RUN_STAMP",
}

# Small and fast on 2 CPU cores: 32 px crops of the 80 px sample images, and timm's test_resnet (a
# ResNet with BatchNorm, 0.4 M parameters: the code paths of resnet18 at a seventh of its epoch time
# and a sixteenth of its checkpoint bytes). The default model, resnet18, trains in the demo test and the
# recipes.
TINY = [
    "trainer.device=cpu",
    "model.name=test_resnet",
    "data.train_size=32",
    "data.val_resize=36",
    "data.val_size=32",
    "loader.batch_size=16",
    "loader.num_threads=2",
    "trainer.log_every_n_steps=2",
]


def pytest_collection_finish(session) -> None:
    """Before the first test of this process (an xdist worker, or pytest without xdist)."""
    import torch

    import train  # noqa: F401 - its imports (timm, DALI) before the freeze below

    # One intra-op thread, as launch_env gives children: the tensors are tiny, and on 2 shared
    # cores two spinning OpenMP threads made an in-process epoch 5-8x slower.
    torch.set_num_threads(1)
    # What the imports made (torch, timm, Hydra, DALI: ~400k objects) moves out of the collector's
    # view: each full collection (run_inprocess's, and the automatic ones) then scans only what the
    # tests made, ~0.25 s less each.
    gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist (-n 2) hands out tests one at a time (at most two queued per worker), so that
    the order below decides who runs what. By default its load scheduling starts each worker on a
    chunk of consecutive tests, a quarter of its share (45 of 367): every slow test but test_train's
    went to the first worker, whose chunk was then the suite's critical path, while the second ran
    out of tests (it never takes back tests handed out). A --maxschedchunk given is kept."""
    if getattr(config.option, "maxschedchunk", 0) is None:  # 0: xdist absent or off (-p no:xdist)
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (in file order otherwise): pytest-xdist hands tests out in this order,
    so the last ones, which decide when the suite ends, are short and the workers end together."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """The demo's sample dataset: 10 classes, 400 train / 100 val JPEGs (generated once)."""
    from dali_train.data.sample import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("data") / "sample", workers=2)


@pytest.fixture(scope="session")
def small_root(tmp_path_factory) -> Path:
    """A smaller set (10 classes × 12 train / 5 val) for multi-epoch and multi-process runs."""
    from dali_train.data.sample import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("data") / "small", train_per_class=12, val_per_class=5)


@pytest.fixture
def imagenette_mini() -> Path:
    if not IMAGENETTE_MINI.is_dir():
        pytest.skip(f"{IMAGENETTE_MINI} is absent (it sits beside the project checkout in development)")
    return IMAGENETTE_MINI


def permissions_hold() -> list[str]:
    """A command prefix under which file permissions apply: root passes over them (CAP_DAC_OVERRIDE
    and CAP_DAC_READ_SEARCH), so as root the command runs without those two capabilities."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: file permissions cannot be made to apply")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def launch_env() -> dict[str, str]:
    """The environment for a child train.py/torchrun: no inherited rank variables (pytest itself
    may run inside a SLURM job or torchrun; torchrun sets its own), one OpenMP thread."""
    inherited = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    return {**inherited, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_train(
    args: list[str],
    *,
    nproc: int = 1,
    cwd: Path | None = None,
    timeout: int = 600,
    check: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run train.py in a subprocess (under torchrun with gloo when nproc > 1)."""
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        cmd = [sys.executable]
    full_env = {**launch_env(), **(env or {})}
    proc = subprocess.run(
        cmd + [str(REPO / "train.py"), *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass
class InProcessRun:
    """What an in-process run left: its summary.json, the log lines it wrote, and how it ended."""

    summary: dict
    log: str  # the train.log lines of this run (the console shows the same on rank 0)
    ended: BaseException | None  # RunEnded or UserError (main's exit 2 and one line); None: completed


def compose_run_config(overrides: list[str], run_dir: Path) -> DictConfig:
    """conf/ composed as `python train.py OVERRIDES hydra.run.dir=RUN_DIR` would, Hydra's node included."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"hydra.run.dir={run_dir}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    return cfg


@contextmanager
def process_state_restored() -> Iterator[None]:
    """What a run or a script changes in this process (root logging handlers, SIGTERM/SIGINT/SIGUSR2
    handlers, deterministic algorithms, environment variables, Hydra's global state) is restored
    after it; its DALI pipelines and their threads go now, not during the next test."""
    import torch

    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    saved_env = dict(os.environ)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
        for h in list(root.handlers):  # the run's console and train.log handlers
            root.removeHandler(h)
            if h not in saved_handlers:
                h.close()
        for h in saved_handlers:
            root.addHandler(h)
        root.setLevel(saved_level)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        torch.use_deterministic_algorithms(deterministic)
        gc.collect()  # the run's DALI pipelines (and their threads) go first, then the environment
        for key in set(os.environ) - set(saved_env):  # no clear(): a live thread may read it meanwhile
            del os.environ[key]
        os.environ.update(saved_env)


def run_inprocess(overrides: list[str], run_dir: Path, *, check: bool = True) -> InProcessRun:
    """train.run(cfg) in this process, set up as Hydra's run_job does for `python train.py`: the
    run dir as hydra.runtime.output_dir, HydraConfig set, the `hydra` node stripped. Saves the
    ~5 s of imports a subprocess pays; what the run changes in the process is restored after it.

    A RunEnded or UserError (what main turns into exit code 2 or 128+signal and one `error:` line)
    is returned in `ended`, or raised as an AssertionError when `check`."""
    import train

    cfg = compose_run_config(overrides, run_dir)
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(run_dir.resolve())
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    log_file = run_dir / "train.log"
    log_start = log_file.stat().st_size if log_file.is_file() else 0
    ended = None
    with process_state_restored():
        HydraConfig.instance().set_config(cfg)
        try:
            train.run(task_cfg)
        except (train.RunEnded, UserError) as e:
            ended = e
    text = log_file.read_text()[log_start:] if log_file.is_file() else ""
    if check and ended is not None:
        raise AssertionError(f"the run ended with {type(ended).__name__}: {ended}\n{text[-4000:]}")
    summary_file = run_dir / "summary.json"
    return InProcessRun(read_json(summary_file) if summary_file.is_file() else {}, text, ended)


@dataclass
class ScriptRun:
    """What `python SCRIPT ARGS` gave: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def run_script(script: str, *args, capfd: pytest.CaptureFixture, check: bool = True) -> ScriptRun:
    """`python SCRIPT ARGS` (a path in the checkout) in this process, as the interpreter runs a
    script: runpy as `__main__`, its folder first on sys.path, SystemExit turned into the exit
    status as the interpreter does (None: 0; a number: it; a message: printed to stderr, 1). Saves
    the 2-5 s of imports a subprocess pays; `capfd` sees the file descriptors, so DALI's own output
    is in it. Where a process is the subject (torchrun, signals, peak memory, forked workers that
    decode) tests start subprocesses."""
    path = REPO / script
    capfd.readouterr()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(path), *map(str, args)], [str(path.parent)]
    returncode = 0
    try:
        with process_state_restored():
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            returncode = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            returncode = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    out = capfd.readouterr()
    if check and returncode:
        raise AssertionError(f"{script} exited {returncode}:\n{out.out[-3000:]}\n{out.err[-3000:]}")
    return ScriptRun(returncode, out.out, out.err)


def exit_code(ended: BaseException | None) -> int:
    """The exit code train.py's main gives this ending (UserError: 2; RunEnded: its ending's)."""
    import train
    from dali_train.ending import EXIT_USER

    if ended is None:
        return 0
    return ended.ending.exit_code if isinstance(ended, train.RunEnded) else EXIT_USER
