"""Sweeps and scale-out: Hydra multirun and Optuna (`python train.py -m` in this process: Hydra runs
the jobs one after the other in it), the SLURM launcher config, multi-node torchrun."""

from __future__ import annotations

import csv
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dali_train.data.sample import make_image_folder
from dali_train.sweep import EARLIER, write_sweep_summary
from tests.conftest import REPO, TINY, compose_run_config, launch_env, read_json, run_script

pytestmark = pytest.mark.slow


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())


def test_multirun_two_points_each_with_outputs_and_a_summary_table(small_root, tmp_path, capfd):
    sweep = tmp_path / "sweep"
    run_script(
        "train.py",
        "-m",
        *TINY,
        f"data.root={small_root}",
        "trainer.epochs=1",
        "optimizer.lr=0.05,0.2",
        "seed=0,1",
        f"hydra.sweep.dir={sweep}",
        capfd=capfd,
    )
    jobs = job_dirs(sweep)
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    for j in jobs:
        assert read_json(j / "summary.json")["val_samples"] == 50
        assert list((j / "tensorboard").glob("events.out.tfevents.*"))
    rows = list(csv.DictReader(open(sweep / "sweep_summary.csv")))
    assert sorted(r["overrides"] for r in rows) == [
        f"optimizer.lr={lr} seed={seed}" for lr in ("0.05", "0.2") for seed in (0, 1)
    ]
    tops = [float(r["best_val_top1"]) for r in rows]
    assert tops == sorted(tops, reverse=True)  # best first
    md = (sweep / "sweep_summary.md").read_text()
    assert "| job | overrides | best_val_top1" in md
    # the seeds table: one row per learning rate, its two seeds' final top-1 and their mean, best mean first
    final = {r["overrides"]: float(r["val_top1"]) for r in rows}
    means = {lr: (final[f"optimizer.lr={lr} seed=0"] + final[f"optimizer.lr={lr} seed=1"]) / 2 for lr in ("0.05", "0.2")}
    table = md.split("## By setting, over seeds")[1].splitlines()
    settings = [line.split(" | ") for line in table if line.startswith("| optimizer.lr=")]
    assert {s[0].removeprefix("| optimizer.lr="): s[3] for s in settings} == {k: f"{v:.2f}" for k, v in means.items()}
    assert all(s[1] == "0 1" for s in settings)
    listed = [float(s[3]) for s in settings]
    assert listed == sorted(listed, reverse=True)

    # the same sweep again into the same dir: every job is refused (its dir holds a run), and the
    # summary marks the rows as the earlier runs' instead of listing them as this sweep's results
    before = (sweep / "0" / "summary.json").read_text()
    again = run_script(
        "train.py", "-m", *TINY, f"data.root={small_root}", "trainer.epochs=1", "optimizer.lr=0.05,0.2", "seed=0,1",
        f"hydra.sweep.dir={sweep}", capfd=capfd, check=False,
    )  # fmt: skip
    assert again.returncode == 2 and "4 job(s) of the sweep failed" in again.stderr, again.stderr[-2000:]
    assert (sweep / "0" / "summary.json").read_text() == before
    rows = list(csv.DictReader(open(sweep / "sweep_summary.csv")))
    assert len(rows) == 4 and {r["end_state"] for r in rows} == {EARLIER}, rows
    assert "(best: " not in again.stdout and "(best mean" not in again.stdout, again.stdout[-2000:]


def test_a_failed_job_does_not_end_the_sweep(small_root, tmp_path, capfd):
    """Job 0 diverges (LR 1e5): job 1 still runs, the summary lists both with their end_state, and
    the sweep exits 2 with one line naming the failed job."""
    sweep = tmp_path / "sweep"
    proc = run_script(
        "train.py", "-m", *TINY, f"data.root={small_root}", "trainer.epochs=2", "optimizer.lr=1e5,0.1",
        f"hydra.sweep.dir={sweep}", capfd=capfd, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    states = {r["overrides"]: r["end_state"] for r in csv.DictReader(open(sweep / "sweep_summary.csv"))}
    assert states["optimizer.lr=0.1"] == "completed" and states["optimizer.lr=100000.0"].startswith("diverged"), states
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 job(s) of the sweep failed; job 0: ") and "NaN" in last, last


def test_a_sweep_whose_every_job_failed_ends_with_its_summary_and_one_error_line(small_root, tmp_path, capfd):
    sweep = tmp_path / "sweep"
    proc = run_script(
        "train.py", "-m", *TINY, f"data.root={small_root}", "trainer.epochs=1", "optimizer.lr=1e5,1e6",
        f"hydra.sweep.dir={sweep}", capfd=capfd, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "sweep summary: " in proc.stdout and "(no job validated)" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: 2 job(s) of the sweep failed; job 0: ")


def test_a_signal_after_a_jobs_last_check_stops_the_sweep_before_the_next_job(small_root, tmp_path, capfd):
    """SIGTERM as job 0 ends (after its last stop check): job 0 stays completed, job 1 trains
    nothing, and the sweep exits 128+15 there (it used to run every remaining job and exit 0)."""
    sweep = tmp_path / "sweep"
    callback = "+hydra.callbacks.signal_at_job_end._target_=tests.helpers.signal_at_job_end.SignalAtFirstJobEnd"
    proc = run_script(
        "train.py", "-m", *TINY, f"data.root={small_root}", "trainer.epochs=1", "optimizer.lr=0.1,0.2,0.3",
        callback, f"hydra.sweep.dir={sweep}", capfd=capfd, check=False,
    )  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert json.loads((sweep / "0" / "summary.json").read_text())["end_state"] == "completed"
    stopped = json.loads((sweep / "1" / "summary.json").read_text())
    assert stopped["end_state"] == "stopped by signal" and "nothing run" in stopped["end_message"]
    assert not (sweep / "2").exists()


def test_a_job_that_ended_early_is_marked_and_left_out_of_the_mean_over_seeds(tmp_path):
    """A sweep dir as train.py -m leaves it, where seed 1 of one setting was stopped by a signal and
    a job of another was killed before its summary.json: each is listed with how it ended, a mean is
    over the completed seeds and says when it is of fewer, and a setting whose every seed completed
    ranks first (lr 0.1's one lucky seed used to be named the best mean; the killed job was left out)."""
    jobs = [("0", "0.1", "0", 70.0, "completed"), ("1", "0.1", "1", 30.0, "stopped by signal"),
            ("2", "0.2", "0", 60.0, "completed"), ("3", "0.2", "1", 62.0, "completed"),
            ("4", "0.3", "0", None, None), ("5", "0.4", "0", None, "")]  # fmt: skip
    for job, lr, seed, top1, state in jobs:
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n- seed={seed}\n")
        summary = {"val_top1": top1, "best_val_top1": top1, "end_state": state, "epochs_completed": 1}
        if state is not None:  # job 4: SIGKILL, no summary.json; job 5: an empty one (a machine crash)
            (tmp_path / job / "summary.json").write_text(json.dumps(summary) if state else "")
    write_sweep_summary(tmp_path)
    text = (tmp_path / "sweep_summary.md").read_text()
    assert "6 jobs" in text
    settings = [line.split(" | ") for line in text.split("## By setting")[1].splitlines() if line.startswith("| optimizer.lr=")]
    assert [(s[0], s[2], s[3]) for s in settings] == [
        ("| optimizer.lr=0.2", "60.00 / 62.00", "61.00"),
        ("| optimizer.lr=0.1", "70.00 / 30.00 (stopped by signal)", "70.00 (1 of 2)"),
        ("| optimizer.lr=0.3", " (no summary.json (killed, running, or failed before training))", " (0 of 1)"),
        ("| optimizer.lr=0.4", " (unreadable summary.json (JSONDecodeError))", " (0 of 1)"),
    ]
    assert {r["end_state"] for r in csv.DictReader(open(tmp_path / "sweep_summary.csv"))} == {
        "completed", "stopped by signal", "no summary.json (killed, running, or failed before training)",
        "unreadable summary.json (JSONDecodeError)",
    }  # fmt: skip


def test_optuna_sweep_three_trials_one_failing(small_root, tmp_path, capfd):
    """A trial with a bad value is a failed trial and the search goes on (a failed job's NaN made
    Optuna's tell() raise: the search died at the first failure); the sweep exits 2 at its end."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "optuna"
    proc = run_script(
        "train.py",
        "-m",
        "+hparams_search=optuna",
        "hydra.sweeper.n_trials=3",
        *TINY,
        "trainer.label_smoothing=interval(0.0,1.5)",  # 1 or more: a failed trial
        f"data.root={small_root}",
        "trainer.epochs=1",
        f"hydra.sweep.dir={sweep}",
        capfd=capfd,
        check=False,
    )
    states = [r["end_state"] for r in csv.DictReader(open(sweep / "sweep_summary.csv"))]
    assert len(job_dirs(sweep)) == 3 and len(states) == 3, states
    assert "completed" in states and "error" in states, states
    assert (sweep / "optimization_results.yaml").is_file()  # Optuna's own record of the best trial
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: "), proc.stderr[-2000:]


def test_slurm_launcher_config_composes_without_slurm():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    hydra_cfg = OmegaConf.to_yaml(compose_run_config(["hydra/launcher=slurm"], Path("unused")).hydra)
    assert "SlurmLauncher" in hydra_cfg and "tasks_per_node: 8" in hydra_cfg  # as `--cfg hydra` prints it


def test_sweep_torchrun_expands_the_cartesian_product():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "sweep_torchrun.py"),
            "--dry-run",
            "--nproc",
            "2",
            "optimizer.lr=0.1,0.2",
            "model=resnet18,resnet50",
            "trainer.epochs=3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    points = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(points) == 4 and "optimizer.lr=0.2 model=resnet50 trainer.epochs=3" in proc.stdout
    assert "--nproc_per_node=2" in proc.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dry-run", "model.kwargs={a: 1"], "error: the overrides: no viable alternative at input '{a: 1'"),
        (["--out", "OUT", "optimizer.lr=0.1"], "error: --out OUT: holds files already; choose a new folder"),
    ],
)
def test_sweep_torchrun_refuses_a_bad_override_and_a_used_folder_in_one_line(tmp_path, argv, message):
    """A malformed override was a parser traceback; a reused --out mixed the old jobs into the summary."""
    (tmp_path / "used" / "0").mkdir(parents=True)
    argv = [str(tmp_path / "used") if a == "OUT" else a for a in argv]
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "sweep_torchrun.py"), *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and proc.stderr.strip() == message.replace("OUT", str(tmp_path / "used")), proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_read_disjoint_shards_that_cover_the_dataset(tmp_path):
    # One image per class: the labels a rank reads name the files it read.
    root = make_image_folder(tmp_path / "data", num_classes=24, train_per_class=1, val_per_class=1)
    port = free_port()
    env = launch_env()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=shard-test",
                str(REPO / "tests" / "helpers" / "shard_probe.py"),
                str(root),
                str(tmp_path),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world_size"] == 2 for r in ranks)
    train = [set(r["train"]) for r in ranks]
    assert not train[0] & train[1] and train[0] | train[1] == set(range(24))
    assert len(ranks[0]["train"]) == len(ranks[1]["train"]) == 12
    assert ranks[0]["val"] + ranks[1]["val"] == list(range(24))  # contiguous val shards, each file once


def test_train_multinode_sh_runs_two_nodes_on_localhost(small_root, tmp_path):
    """The README's multi-node command, as written, on two "nodes" of CPU processes: node 0 starts
    one per entry of its CUDA_VISIBLE_DEVICES (two; nvidia-smi would count every GPU), node 1 the
    NPROC it is given. Three ranks also give validation a shard that ends a batch early."""
    port, run = free_port(), tmp_path / "run"
    train = [*TINY, f"data.root={small_root}", "trainer.epochs=1", "trainer.max_steps_per_epoch=2", f"hydra.run.dir={run}"]
    procs = [
        subprocess.Popen(
            ["bash", str(REPO / "scripts" / "train_multinode.sh"), *train],
            env={**launch_env(), "NNODES": "2", "NODE_RANK": str(node), "MASTER": f"127.0.0.1:{port}",
                 "PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent),
                 **({"CUDA_VISIBLE_DEVICES": "0,1"} if node == 0 else {"NPROC": "1"})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
    summary = read_json(run / "summary.json")
    # 50 val images on 3 ranks: shards of 16/17/17, so rank 0's second val batch is empty (it was NaN)
    assert summary["world_size"] == 3 and summary["val_samples"] == 50 and summary["end_state"] == "completed"
