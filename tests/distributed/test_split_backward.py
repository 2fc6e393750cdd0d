"""Split backwards across processes: ZB-H1 with every weight-gradient placement computes the
same training run as one process (and so as 1F1B), over pipeline depths, replicas, both
policies, every activation choice, views, clipping on and off and sharded state (a covering
set, not the product); and each stage's ledger equals the simulator's kind by kind."""

from __future__ import annotations

import json

import pytest
import torch

from ratrain.training.metrics import read_metrics
from ratrain.schedule.grid import RankGrid
from ratrain.runtime.launch import launch_local
from ratrain.schedule.plan import build_plan
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate
from ratrain.training.run import rank_main

from .conftest import assert_final_weights_match, micro_config, one_thread

pytestmark = pytest.mark.dist

STEPS = 4

# (pp, dp, policy, activation per stage, view window, weight_grad, clip, sharded)
CASES = [
    (1, 2, "ratrain", ["keep"], None, "grouped", True, False),  # unit-major backward
    (1, 2, "baseline", ["recompute"], 0, "bubble", False, False),
    (2, 1, "ratrain", ["recompute", "offload"], 1, "bubble", False, False),
    (2, 2, "baseline", ["offload", "offload"], 0, "grouped", True, False),
    (2, 2, "ratrain", ["keep", "recompute"], 1, "grouped", False, True),
    (4, 1, "ratrain", ["offload", "keep", "recompute", "keep"], None, "bubble", True, False),
    (4, 1, "ratrain", ["keep", "recompute", "keep", "offload"], 1, "bubble:1", False, False),
]


def _id(case) -> str:
    pp, dp, policy, activation, window, weight_grad, clip, sharded = case
    return (f"{pp}x{dp}-{policy}-{'+'.join(activation)}-w{window}-{weight_grad}"
            f"{'-clip' if clip else ''}{'-sharded' if sharded else ''}")


def _single_process(cfg, run_dir):
    with one_thread():
        rank_main(cfg, str(run_dir), False, False, False)


@pytest.fixture(scope="module")
def references(corpus, tmp_path_factory):
    """The plain single-process run, with clipping and without."""
    out = {}
    for clip in (True, False):
        cfg = micro_config(*corpus, steps=STEPS)
        cfg.train.grad_clip = 1.0 if clip else 0.0
        out[clip] = tmp_path_factory.mktemp(f"reference-clip{clip}")
        _single_process(cfg, out[clip])
    return out


@pytest.mark.parametrize("case", CASES, ids=map(_id, CASES))
def test_split_schedule_matches_single_process(case, corpus, references, tmp_path):
    pp, dp, policy, activation, window, weight_grad, clip, sharded = case
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.train.grad_clip = 1.0 if clip else 0.0
    p = cfg.parallel
    p.pp, p.dp, p.policy, p.shard_state = pp, dp, policy, sharded
    p.schedule, p.weight_grad = "zbh1", weight_grad
    plan = build_plan(cfg.model.n_layers, pp, dp, cfg.n_micro, schedule="zbh1", policy=policy,
                      activation=activation if pp > 1 else activation[0], view_window=window,
                      clip=clip, shard_state=sharded, weight_grad=weight_grad)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    p.plan_file = str(plan_file)
    run_dir = tmp_path / "run"
    launch_local(pp * dp, rank_main, (cfg, str(run_dir), False, False, False),
                 error_dir=run_dir / "errors")

    ref_dir = references[clip]
    ref_rows, rows = read_metrics(ref_dir / "metrics.jsonl"), read_metrics(run_dir / "metrics.jsonl")
    ref_loss = torch.tensor([r["loss"] for r in ref_rows], dtype=torch.float64)
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    assert len(loss) == STEPS
    assert float(((loss - ref_loss).abs() / ref_loss).max()) < 1e-5, (loss, ref_loss)
    assert_final_weights_match(run_dir, ref_dir, cfg.model.n_units)

    predicted = simulate(plan, cfg.model, load_profile("cpu-local"), seq_len=cfg.train.seq_len,
                         micro_batch_size=cfg.train.micro_batch_size, dtype=cfg.train.dtype)
    measured = json.loads((run_dir / "summary.json").read_text())[
        "ledger_at_peak_by_kind_per_rank"]
    grid = RankGrid(pp, dp)
    for s, rank in enumerate(predicted.ranks):
        assert rank.at_peak == measured[grid.rank(s, 0)], s
