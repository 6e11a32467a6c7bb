"""scripts/benchmark.py's loader variants, windows, --tune, profiling and torchrun mode, and the profile summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dali_train.profiling import summarize
from tests.conftest import REPO, ScriptRun, launch_env, run_script

CPU_RUN = ["trainer.device=cpu", "data=imagenet", "data.train_size=32", "loader.batch_size=8"]
THREADS = ["--loader-set", "dali_cpu:loader.num_threads=1"]  # a key of the DALI loaders only: set per loader


def benchmark(args: list, capfd, *, check: bool = True) -> ScriptRun:
    """`python scripts/benchmark.py ARGS`, in this process (conftest.run_script)."""
    return run_script("scripts/benchmark.py", *args, capfd=capfd, check=check)


def benchmark_under_torchrun(args: list, nproc: int) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=NPROC scripts/benchmark.py ARGS`: real processes, a gloo group."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
         str(REPO / "scripts" / "benchmark.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**launch_env(), "PYTHONPATH": str(REPO)},  # this checkout's package, installed or not
    )  # fmt: skip
    if proc.returncode:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc


def _kernel(stream: int, start: float, dur: float, name: str = "k") -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": dur, "args": {"stream": stream}}


def test_profile_summary_measures_idle_overlap_and_host_waits():
    events = [
        # model stream 7: busy 0-400 and 600-1000 us; a loader stream 9 busy 300-700 us
        _kernel(7, 0, 400, "conv"),
        _kernel(7, 600, 400, "conv"),
        _kernel(9, 300, 400, "resize"),
        {"ph": "X", "cat": "user_annotation", "name": "data wait", "ts": 0, "dur": 250, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 30, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 0, "dur": 500, "tid": 2},
    ]
    text = summarize(events)
    assert "window 1.0 ms" in text and "GPU idle (no stream busy) 0.0 ms = 0.0%" in text
    # the model stream is idle 400-600 us; stream 9 covers all of it; they overlap 300-400 and 600-700
    assert "model stream 7: busy 80.0%; its idle time 0.2 ms, of which other streams busy 0.2 ms" in text
    assert "overlap the model stream for 0.2 ms" in text
    assert "host in 'data wait': 0.2 ms in 1 ranges" in text
    assert "CUDA API thread 2: cudaDeviceSynchronize x1, 0.5 ms" in text and "CUDA API main: launch x1" in text
    assert "stream 9: 1 kernels/copies, busy 0.4 ms (40.0%); top: resize 0.4 ms" in text
    assert summarize([]).startswith("no GPU activity")
    # the model stream's idle tail (its last kernel ends at 60 us, the loader's at 100 us) counts too
    tail = summarize([_kernel(7, 0, 60, "conv"), _kernel(9, 60, 40, "resize")])
    assert "busy 60.0%; its idle time 0.0 ms, of which other streams busy 0.0 ms" in tail  # 40 us, rounded
    assert "longest 0.04 ms" in tail


@pytest.mark.slow
def test_variants_hold_and_profile_on_cpu(sample_root, tmp_path, capfd):
    out, prof = tmp_path / "bench", tmp_path / "prof"
    proc = benchmark(
        ["--modes", "loader", "model", "e2e", "--models", "test_resnet", "--loaders", "dali_cpu", "deep",
         "--variant", "deep=dali_cpu:loader.prefetch_queue_depth=3,loader.exec_dynamic=false",
         "--hold-batches", 2, "--steps", 2, "--warmup", 1, "--repeats", 1, "--profile", prof, "--out", out,
         *THREADS, "--", *CPU_RUN, f"data.root={sample_root}"],
        capfd,
    )  # fmt: skip
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["mode"], r["loader"]) for r in rows] == [
        ("loader", "dali_cpu"),
        ("loader", "deep"),
        ("model", "synthetic"),
        ("e2e", "dali_cpu"),
        ("e2e", "deep"),
    ]
    assert all(r["build_s"] > 0 and r["first_batch_s"] > 0 for r in rows if r["mode"] != "model")  # DALI's, timed
    assert sorted(p.name for p in prof.glob("profile_*.txt")) == [
        "profile_test_resnet_dali_cpu_compileoff.txt",
        "profile_test_resnet_deep_compileoff.txt",
        "profile_test_resnet_synthetic_compileoff.txt",
    ]
    assert (prof / "trace_test_resnet_deep_compileoff.json.gz").is_file()
    # every row timed before the first profile: a profile slows what follows it in the process (CUPTI stays attached)
    lines = proc.stdout.splitlines()
    last_row = max(i for i, line in enumerate(lines) if line.startswith(("e2e ", "model ", "loader-only ")))
    assert last_row < min(i for i, line in enumerate(lines) if line.startswith("profile ")), proc.stdout
    assert "no GPU activity" in proc.stdout  # the summary of a CPU run says so


@pytest.mark.slow
def test_under_torchrun_rank_zero_reports_for_both(sample_root, tmp_path):
    out = tmp_path / "bench"
    proc = benchmark_under_torchrun(
        ["--modes", "model", "e2e", "--models", "test_resnet", "--loaders", "dali_cpu", "--steps", 2, "--warmup", 1,
         "--repeats", 1, "--profile", tmp_path / "prof", "--out", out, *THREADS, "--", *CPU_RUN,
         f"data.root={sample_root}"],
        nproc=2,
    )  # fmt: skip
    result = json.loads((out / "results.json").read_text())
    assert result["env"]["processes"] == 2
    assert sorted(p.name for p in (tmp_path / "prof").glob("profile_*.txt")) == [  # each rank profiles its own
        f"profile_test_resnet_{loader}_compileoff_rank{rank}.txt" for loader in ("dali_cpu", "synthetic") for rank in (0, 1)
    ]
    assert [r["mode"] for r in result["rows"]] == ["model", "e2e"]
    assert proc.stdout.count("e2e test_resnet compile=off dali_cpu:") == 1  # rank 0 alone reports


def test_unknown_loader_name_is_refused(capfd):
    proc = benchmark(["--loaders", "dali", "fast", "--", "trainer.device=cpu"], capfd, check=False)
    assert proc.returncode == 2 and "fast is neither dali, dali_cpu, pytorch nor a --variant name" in proc.stderr


def test_malformed_variant_is_refused(capfd):
    proc = benchmark(
        ["--variant", "x=dali:loader.num_threads", "--loaders", "x", "--", "trainer.device=cpu"], capfd, check=False
    )
    assert proc.returncode == 2 and "--variant x=dali:loader.num_threads: expected NAME=LOADER:KEY=VALUE" in proc.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--loader-set", "loader.num_threads=12"], "--loader-set loader.num_threads=12: expected LOADER:KEY=VALUE"),
        (["--repeats", "0"], "--repeats 0: must be at least 1"),
        (["--warmup", "0"], "--warmup 0: must be at least 1"),  # the first window would time the pipeline build
        (["--tune", "--grid", "loader.name=dali,dali_cpu"], "loader.name changes what a run is"),  # then the default
        (["--modes", "model", "--", "trainer.device=cpu", "loader.batchsize=3"], "loader.batchsize: Key 'batchsize'"),
        # --loader-set of a variant, and of dali under --tune, reach the config (both were dropped unread)
        (["--modes", "loader", "--loaders", "v", "--variant", "v=dali_cpu:loader.num_threads=1",
          "--loader-set", "v:loader.bogus_key=1", "--", "trainer.device=cpu"], "loader.bogus_key: Key 'bogus_key'"),
        (["--tune", "--grid", "loader.num_threads=1,2", "--loader-set", "dali:loader.bogus_key=1", "--",
          "trainer.device=cpu"], "loader.bogus_key: Key 'bogus_key'"),
        # paths that failed only after the measuring, losing its results
        (["--out", REPO / "README.md"], "README.md: a file; results go in a folder"),
        (["--tune", "--grid", "loader.num_threads=1,2", "--local", REPO / "conf"], "conf: a folder; --tune merges"),
        (["--tune", "--profile", "prof"], "--profile: not with --tune"),  # it would profile nothing
    ],
)
def test_bad_input_is_one_line(argv, message, capfd):
    """A malformed flag was ignored (--loader-set) or written for every later run (--grid); zero
    counts and config typos ended in tracebacks."""
    proc = benchmark(argv, capfd, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_profile_summary_names_a_file_that_is_no_trace(tmp_path, capfd):
    (tmp_path / "t.json").write_text("{}")
    for path in (tmp_path / "t.json", tmp_path / "missing.json.gz"):
        proc = run_script("scripts/profile_summary.py", path, capfd=capfd, check=False)
        assert proc.returncode == 2 and f"{path}: not a readable torch.profiler Chrome trace" in proc.stderr


@pytest.mark.slow
def test_windows_stay_inside_one_epoch(sample_root, tmp_path, capfd):
    """400 files / batch 8 = 50 steps per epoch: windows of 20 after 5 warm-up steps fit twice in an
    epoch, the third starts after a drained switch; an epoch shorter than warm-up + window is refused."""
    out = tmp_path / "bench"
    benchmark(
        ["--modes", "loader", "model", "--models", "test_resnet", "--loaders", "dali_cpu", "--steps", 20, "--warmup", 5,
         "--repeats", 3, "--out", out, "--loader-set", "dali_cpu:loader.num_threads=2",
         "--", *CPU_RUN, f"data.root={sample_root}"],
        capfd,
    )  # fmt: skip
    loader, model = json.loads((out / "results.json").read_text())["rows"]
    assert len(loader["img_s_all"]) == 3 and loader["epoch_switches"] == 1  # drained once, outside any window
    assert model["epoch_switches"] == 0  # the model-only loader is made long enough
    assert "build s" in (out / "results.md").read_text()
    proc = benchmark(
        ["--modes", "loader", "--loaders", "dali_cpu", "--steps", 60, "--warmup", 1, "--out", out,
         "--", *CPU_RUN, f"data.root={sample_root}"],
        capfd,
        check=False,
    )  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "an epoch has 50 steps per process" in errors[0]


def test_tune_measures_the_grid_end_to_end_and_merges_the_best(sample_root, tmp_path, capfd):
    local = tmp_path / "local" / "loader" / "dali.yaml"  # loader=dali's local file: its keys are DALI's
    local.parent.mkdir(parents=True)
    local.write_text("exec_dynamic: false\n")
    out = tmp_path / "bench"
    proc = benchmark(
        ["--tune", "--models", "test_resnet", "--grid", "loader.num_threads=1,2", "loader.prefetch_queue_depth=2",
         "--steps", 2, "--warmup", 1, "--repeats", 1, "--local", local, "--out", out,
         "--", *CPU_RUN, f"data.root={sample_root}"],
        capfd,
    )  # fmt: skip
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["settings"] for r in rows] == [
        {"loader.num_threads": 1, "loader.prefetch_queue_depth": 2},
        {"loader.num_threads": 2, "loader.prefetch_queue_depth": 2},
    ]
    best = max(rows, key=lambda r: r["img_s"])["settings"]
    written = yaml.safe_load(local.read_text())
    assert written == {"exec_dynamic": False, "num_threads": best["loader.num_threads"], "prefetch_queue_depth": 2}
    assert local.read_text().startswith("# loader=dali: fastest") and "written to" in proc.stdout
    assert "| tune | test_resnet | off | num_threads=1 prefetch_queue_depth=2 |" in proc.stdout


def test_model_only_labels_fit_a_dataset_of_more_than_1000_classes(tmp_path, capfd):
    """The model, shared by both modes, is built on the synthetic loader's class count: 1000 made the
    labels of a 1200-class dataset out of range for e2e (an IndexError, a device assert on a GPU;
    here 32 images of which ~1/6 have such labels)."""
    data = tmp_path / "c1200"
    run_script("scripts/make_synthetic_imagenet.py", "--out", data, "--classes", 1200, "--train-per-class", 1,
               "--val-per-class", 1, "--width", 16, "--height", 16, "--noise", 1, "--workers", 1, capfd=capfd)  # fmt: skip
    proc = benchmark(
        ["--modes", "model", "e2e", "--models", "test_resnet", "--loaders", "dali_cpu", *THREADS, "--steps", 1,
         "--warmup", 1, "--repeats", 1, "--out", tmp_path / "out", "--", "trainer.device=cpu", "data=imagenet",
         f"data.root={data}", "data.train_size=16", "data.val_resize=16", "data.val_size=16", "loader.batch_size=16",
         "data.verify_files=false"],
        capfd,
    )  # fmt: skip
    assert "e2e dali_cpu ÷ model-only, test_resnet compile=off" in proc.stdout, proc.stdout[-2000:]


def test_a_local_file_tune_could_not_merge_into_is_refused_before_measuring(tmp_path, capfd):
    local = tmp_path / "dali.yaml"
    local.write_text("num_threads: [4\n")
    proc = benchmark(["--tune", "--grid", "loader.num_threads=1,2", "--local", local], capfd, check=False)
    assert proc.returncode == 2 and f"--local {local}: not YAML the best can merge into" in proc.stderr, proc.stderr
