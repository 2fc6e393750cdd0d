"""A plan the planner writes for 2 local ranks under a memory budget runs as is, and holds what
the simulator predicted for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ratrain.training.metrics import read_metrics
from ratrain.schedule.grid import RankGrid

pytestmark = pytest.mark.dist


def test_a_planned_run_holds_what_was_planned(corpus, tmp_path):
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1"}
    budget = 60e6
    plan = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "plan", "--model", "tiny", "--profile", "cpu-local",
         "--devices", "2", "--memory-budget", str(budget), "--out", "plan.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    planned = json.loads((tmp_path / "plan.json").read_text())
    train = subprocess.run(
        [sys.executable, "-m", "ratrain.cli", "train", "--plan", "plan.json", "--data",
         str(corpus[0]), "--steps", "3", "--eval-every", "0", "--no-progress", "--no-trace",
         "--run-dir", "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    last = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    held = last.get("ledger_peak_bytes_per_rank", [])
    world = planned["run"]["parallel"]["pp"] * planned["run"]["parallel"]["dp"]
    assert len(held) == world
    predicted = planned["prediction"]["stage_ledger_peak_bytes"]
    peak = planned["prediction"]["stage_peak_bytes"]  # with the compute's working bytes
    grid = RankGrid(planned["pp"], planned["dp"], planned["rank_order"])
    for rank, measured in enumerate(held):
        stage = grid.coords(rank)[0]
        assert measured <= budget * 0.9
        assert measured == pytest.approx(predicted[stage], rel=0.01)
        assert measured < peak[stage] <= budget * 0.9
