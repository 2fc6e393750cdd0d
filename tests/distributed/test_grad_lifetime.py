"""Gradient lifetimes of sharded state: a unit's full-size gradient freed once reduce-scattered
("transient"), or reduce-scattered per micro-batch ("micro-batch"); and hybrid sharding (state
sharded within groups of replicas, replicated across them). The run computes the same
training as one process; the executor's ledger is the simulator's, kind by kind; checkpoints
resume under another layout; and the full-size gradient no longer outlives its sync."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ratrain import checkpoint
from ratrain.setup import run_plan
from ratrain.training.metrics import read_metrics
from ratrain.schedule.grid import RankGrid
from ratrain.runtime.launch import launch_local
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate
from ratrain.training.run import rank_main, train

from .conftest import STEPS, assert_final_weights_match, micro_config

pytestmark = pytest.mark.dist


def _config(corpus, pp, dp, lifetime, steps=STEPS, **parallel):
    cfg = micro_config(*corpus, steps=steps)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.schedule = pp, dp, "1f1b"
    cfg.parallel.shard_state, cfg.parallel.view_window = True, 1
    cfg.parallel.grad_lifetime = lifetime
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    return cfg


def _run(cfg, run_dir):
    world = cfg.parallel.pp * cfg.parallel.dp
    launch_local(world, rank_main, (cfg, str(run_dir), False, False, False),
                 error_dir=run_dir / "errors")
    return read_metrics(run_dir / "metrics.jsonl")


def _ledgers(run_dir):
    return json.loads((run_dir / "summary.json").read_text())["ledger_at_peak_by_kind_per_rank"]


@pytest.mark.parametrize("pp,dp,lifetime,parallel", [
    (1, 2, "transient", {}),
    (2, 2, "transient", {}),
    (1, 4, "micro-batch", {}),
    (2, 2, "micro-batch", {"activation": "recompute"}),
    (1, 2, "transient", {"schedule": "zbh1", "weight_grad": "grouped"}),
    # hybrid sharding on two simulated nodes of two replicas each
    (1, 4, "step", {"shard_group": 2}),
    (2, 4, "micro-batch", {"shard_group": 2}),
])
def test_gradient_lifetime_matches_single_process(pp, dp, lifetime, parallel, corpus, reference,
                                                  tmp_path):
    ref_cfg, ref_dir = reference
    cfg = _config(corpus, pp, dp, lifetime, **parallel)
    rows = _run(cfg, tmp_path)

    ref_loss = torch.tensor([r["loss"] for r in read_metrics(ref_dir / "metrics.jsonl")],
                            dtype=torch.float64)
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    assert len(loss) == STEPS
    assert float(((loss - ref_loss).abs() / ref_loss).max()) < 1e-5, (loss, ref_loss)
    assert_final_weights_match(tmp_path, ref_dir, cfg.model.n_units)

    # The simulator replays the executor's ledger calls: replica 0 of each stage, kind by kind.
    plan = run_plan(cfg)
    assert plan.grad_lifetime == lifetime
    predicted = simulate(plan, cfg.model, load_profile("cpu-local"), seq_len=cfg.train.seq_len,
                         micro_batch_size=cfg.train.micro_batch_size, dtype=cfg.train.dtype)
    measured = _ledgers(tmp_path)
    before = json.loads((tmp_path / "summary.json").read_text())[
        "ledger_before_training_bytes_per_rank"]
    grid = RankGrid(pp, dp)
    for s, rank in enumerate(predicted.ranks):
        at_peak = measured[grid.rank(s, 0)]
        assert rank.peak == sum(at_peak.values()), s
        assert before[grid.rank(s, 0)] == rank.held_before_training, s
        assert ({k: v for k, v in rank.at_peak.items() if v}
                == {k: v for k, v in at_peak.items() if v}), s


@pytest.mark.parametrize("global_batch,shorter", [(8, "transient"), (16, "micro-batch")])
def test_shorter_lifetimes_hold_less_gradient(corpus, tmp_path, global_batch, shorter):
    """dp=4: "step" holds every unit's full gradient all along. With one micro-batch per
    replica, "transient" frees each right after its sync; with two, the first micro-batch's
    backward has made every unit's full gradient before the second's starts, so only
    "micro-batch" (one full gradient per unit between a backward and its reduction) holds less."""
    held = {}
    for lifetime in ("step", shorter):
        run_dir = tmp_path / lifetime
        cfg = _config(corpus, 1, 4, lifetime, steps=2)
        cfg.train.global_batch = global_batch
        _run(cfg, run_dir)
        held[lifetime] = max(rank["gradients"] for rank in _ledgers(run_dir))
    assert held[shorter] < 0.6 * held["step"], held


@pytest.fixture(scope="module")
def micro_batch_run(corpus, tmp_path_factory):
    """10 steps at pp=1 dp=2 with per-micro-batch reduction, checkpointed at steps 5 and 10."""
    cfg = _config(corpus, 1, 2, "micro-batch", steps=10)
    cfg.train.checkpoint_every = 5
    run = tmp_path_factory.mktemp("micro_batch")
    train(cfg, run, progress=False, trace=False)
    return run


@pytest.mark.parametrize("pp,dp,shard,lifetime", [(2, 1, False, "step"), (1, 2, True, "transient")])
def test_gradient_lifetime_checkpoint_resumes_under_another_layout(
        corpus, micro_batch_run, tmp_path, pp, dp, shard, lifetime):
    run = tmp_path / "run"
    shutil.copytree(micro_batch_run, run)
    shutil.rmtree(checkpoint.checkpoint_dir(run, 10))
    cfg = _config(corpus, pp, dp, lifetime, steps=10, shard_state=shard)
    train(cfg, run, resume=True, progress=False, trace=False)

    want = {r["step"]: r["loss"] for r in read_metrics(micro_batch_run / "metrics.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(got) == list(range(1, 11))
    for step in range(6, 11):
        assert abs(got[step] - want[step]) / want[step] < 1e-5, (step, got[step], want[step])
