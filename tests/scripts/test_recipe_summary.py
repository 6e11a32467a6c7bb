"""scripts/recipe_summary.py on real runs: seeds grouped, mean ± std, time to accuracy from metrics.jsonl."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY, run_inprocess


@pytest.mark.slow
def test_seeds_of_a_recipe_become_one_row_with_time_to_accuracy(small_root, tmp_path):
    runs = [tmp_path / f"tiny_s{seed}" for seed in (0, 1)]
    for seed, run in enumerate(runs):
        # seed 1 validates its last epoch only: its epoch-0 row has a null val_top1, which no mark reaches
        every = "trainer.val_every_n_epochs=2" if seed else "trainer.val_every_n_epochs=1"
        run_inprocess([*TINY, f"data.root={small_root}", "trainer.epochs=2", f"seed={seed}", every, "trainer.val_flip_tta=true"], run)
    rows = [[json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs]
    assert rows[0][0]["val_top1"] is not None and rows[1][0]["val_top1"] is None
    assert all(0 < a["wall_time_s"] < b["wall_time_s"] for a, b in rows)  # grows epoch by epoch
    top1 = [r[-1]["val_top1"] for r in rows]
    no_tta = [r[-1]["val_top1_no_tta"] for r in rows]  # the unflipped pass of the same validation
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "recipe_summary.py"), *map(str, runs), "--marks", "0", "101"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = out.splitlines()[-1]
    assert row.startswith("| tiny | ") and f"{statistics.mean(top1):.2f} ± {statistics.stdev(top1):.2f}" in row
    assert f"± {statistics.stdev(top1):.2f} | {statistics.mean(no_tta):.2f} ± {statistics.stdev(no_tta):.2f} |" in row
    assert "[50]" in row  # val_samples of every seed
    first_validated = sorted([rows[0][0]["wall_time_s"], rows[1][1]["wall_time_s"]])
    assert f"{first_validated[0]:.0f}–{first_validated[1]:.0f} s / –" in row  # 0% when first validated; 101% never


@pytest.mark.slow
def test_an_unfinished_seed_is_marked_and_a_resumed_run_times_from_its_start(small_root, tmp_path):
    """Seed 1 stops after job 1 of 2 (epochs_per_job): shown with its end_state, out of the mean.
    Seed 0 runs in two jobs: its epoch-1 wall_time_s goes on from epoch 0's, not from zero."""
    common = [*TINY, f"data.root={small_root}", "trainer.epochs=2", "trainer.epochs_per_job=1"]
    runs = [tmp_path / f"tiny_s{seed}" for seed in (0, 1)]
    for seed, run in enumerate(runs):
        run_inprocess([*common, f"seed={seed}"], run)
    resumed = run_inprocess([*common, "seed=0", "trainer.resume=auto"], runs[0])
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["wall_time_s"] > rows[0]["wall_time_s"] + resumed.summary["job_wall_time_s"] * 0.5
    assert resumed.summary["wall_time_s"] >= rows[1]["wall_time_s"]  # summary.json: the run's, over both jobs
    (runs[1] / "metrics.jsonl").unlink()  # as a run stopped before its first epoch ended leaves it
    stopped = json.loads((runs[1] / "summary.json").read_text())
    (runs[1] / "summary.json").write_text(json.dumps({**stopped, "val_top1": None}))  # ... with nothing validated
    with open(runs[0] / "metrics.jsonl", "a") as f:  # a last line cut short by a kill: left out (it was a traceback)
        f.write('{"epoch": 2, "val_top1": 9')
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "recipe_summary.py"), *map(str, runs)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = out.splitlines()[-1]
    top1 = resumed.summary["val_top1"]
    # the stopped seed has no top-1 (not 0.00), and one completed seed no spread (not ± 0.00)
    assert f"| {top1:.2f}, – (job done) | {top1:.2f} |" in row, row


def test_a_group_where_only_some_seeds_validated_with_the_flip_says_so(tmp_path):
    """Their top-1s mix flipped and unflipped validation: the no-TTA column names the share, and is
    no mean of one kind."""
    for seed, no_tta in ((0, 79.0), (1, None)):
        run = tmp_path / f"tiny_s{seed}"
        run.mkdir()
        row = {"epoch": 0, "val_top1": 80.0 + seed, "val_top1_no_tta": no_tta, "wall_time_s": 10.0}
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        summary = {"end_state": "completed", "val_samples": 50, "wall_time_s": 10.0, **row}
        (run / "summary.json").write_text(json.dumps(summary))
    script = str(REPO / "scripts" / "recipe_summary.py")
    runs = [str(tmp_path / f"tiny_s{seed}") for seed in (0, 1)]
    out = subprocess.run([sys.executable, script, *runs], capture_output=True, text=True, check=True).stdout
    assert "| 80.50 ± 0.71 | 1/2 runs with the flip |" in out.splitlines()[-1]
