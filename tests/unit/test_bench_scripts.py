"""bench/scaling.py and bench/correctness.py: their arithmetic, tables and plots on small
inputs (no training runs; one real planner search of a size that takes a fraction of a
second)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scaling = _load("scaling")
correctness = _load("correctness")


def _row(study, devices, policy, tps):
    return {"study": study, "devices": devices, "policy": policy, "global_batch": devices,
            "search_s": 0.1, "complete": True, "pp": 2, "dp": devices // 2,
            "devices_used": devices, "n_micro": 2, "micro_batch_size": 1, "rank_order": "dp-pp",
            "state_home": "device", "shard_state": True, "view_window": 1,
            "stage_choices": ["recompute", "keep"], "tokens_per_s": tps,
            "tokens_per_s_per_device": tps / devices, "bubble": 0.3, "max_stage_bytes": 17e9}


def _result(rows):
    return {"studies": ["weak"], "rows": rows,
            "settings": {"model": "llama2-7b", "profile": "mt3000", "devices": [8, 16, 32],
                         "sequences_per_device": 1, "strong_batch": 1024, "seq_len": 4096}}


def test_efficiency_is_per_device_against_the_smallest_size_that_fits():
    rows = [_row("weak", 16, "ratrain", 1600.0), _row("weak", 32, "ratrain", 2880.0),
            _row("weak", 16, "baseline", 800.0),
            {"study": "weak", "devices": 8, "policy": "ratrain", "global_batch": 8,
             "search_s": 0.1, "complete": True,
             "account": "no plan fits ...\n  closest: pp=8 dp=1, 1.0 GB over"}]
    scaling.efficiencies(rows)
    assert rows[0]["scaling_efficiency"] == 1.0 and rows[0]["reference_devices"] == 16
    assert abs(rows[1]["scaling_efficiency"] - 0.9) < 1e-12
    assert rows[2]["scaling_efficiency"] == 1.0
    assert "scaling_efficiency" not in rows[3]
    text = scaling.report(_result(rows))
    assert "nothing fits: closest: pp=8 dp=1, 1.0 GB over" in text
    assert "90.0% (vs 16)" in text
    assert "ratrain over baseline (weak): 16: 2.00x" in text
    assert "the paper (measured on MT-3000)" in text


def test_the_scaling_plot_is_written(tmp_path):
    rows = [_row("weak", 16, "ratrain", 1600.0), _row("weak", 32, "ratrain", 2880.0)]
    scaling.efficiencies(rows)
    scaling.plot(_result(rows), tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_a_weak_scaling_point_searches_as_ratrain_plan_does():
    args = argparse.Namespace(model="llama2-7b", profile="mt3000", sequences_per_device=1,
                              strong_batch=1024, seq_len=4096, dtype="float16", budget=20e9,
                              time_limit=30.0)
    row = scaling.plan_at("weak", 8, "ratrain", args)
    assert row["global_batch"] == 8 and row["tokens_per_step"] == 8 * 4096
    if "tokens_per_s" in row:
        assert row["pp"] * row["dp"] <= 8 and row["max_stage_bytes"] <= 20e9 * 0.9
    else:
        assert row["account"].startswith("no plan fits")


def test_correctness_runs_share_everything_but_the_policy_and_layout():
    args = argparse.Namespace(model="tiny", seed=0, seq_len=32, global_batch=4,
                              micro_batch_size=1, steps=5, activation="recompute,keep",
                              baseline_activation="recompute")
    runs = correctness.runs(args)
    common = runs["single"][:runs["single"].index("--pp")]
    for flags in runs.values():
        assert flags[:len(common)] == common
    assert runs["ratrain"][-4:] == ["--activation", "recompute,keep", "--policy", "ratrain"]
    assert runs["baseline"][-4:] == ["--activation", "recompute", "--policy", "baseline"]


def test_deviation_and_window_means():
    assert correctness.deviation([1.0, 2.0, 3.0], [1.0, 2.5, 3.0]) == [0.0, 0.2, 0.0]
    assert correctness.window_means([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.5, 3.5, 5.0]


def test_the_correctness_report_and_plot(tmp_path):
    loss = [3.0, 2.5, 2.0]
    runs = {name: {"layout": name, "loss": list(loss), "wall_s": 1.0, "median_step_s": 0.1}
            for name in ("ratrain", "baseline", "single")}
    runs["single"]["loss"][2] = 2.0 * (1 + 2e-5)
    dev = {}
    for other in ("baseline", "single"):
        per = correctness.deviation(loss, runs[other]["loss"])
        dev[other] = {"max": max(per), "at_step": per.index(max(per)) + 1,
                      "identical_steps": per.count(0.0), "within_target": max(per) <= 1e-5,
                      "max_of_window_means": max(per), "window": 100, "per_step": per}
    result = {"settings": {"model": "tiny", "seq_len": 32, "global_batch": 4,
                           "micro_batch_size": 1, "steps": 3},
              "tokens_trained": 384, "runs": runs, "deviation": dev, "budget_s": 900.0,
              "steps_in_budget": 2000}
    text = correctness.report(result)
    assert "ratrain vs baseline: max relative loss deviation 0.000e+00" in text
    assert "ABOVE the 1e-5 target" in text
    correctness.plot(result, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000
