"""Sharded training state (ZeRO-style): each replica holds 1/dp of every unit's fp32 masters and
AdamW state, and the run computes the same training as one process. Checkpoints hold whole
units in the unsharded format, so they resume under any layout, sharded or not."""

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

from .conftest import STEPS, assert_final_weights_match, micro_config, rel

pytestmark = pytest.mark.dist


def _run(cfg, run_dir):
    world = cfg.parallel.pp * cfg.parallel.dp
    launch_local(world, rank_main, (cfg, str(run_dir), False, False, False),
                 error_dir=run_dir / "errors")
    return read_metrics(run_dir / "metrics.jsonl")


@pytest.mark.parametrize("pp,dp,window,policy", [
    (1, 2, 0, "ratrain"),
    (2, 2, 1, "ratrain"),  # views gathered one unit ahead of use, released after
    (1, 4, 0, "baseline"),
])
def test_sharded_run_matches_single_process(pp, dp, window, policy, corpus, reference, tmp_path):
    ref_cfg, ref_dir = reference
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.policy = pp, dp, policy
    cfg.parallel.shard_state, cfg.parallel.view_window = True, window
    rows = _run(cfg, tmp_path)

    ref_rows = read_metrics(ref_dir / "metrics.jsonl")
    ref_loss = torch.tensor([r["loss"] for r in ref_rows], dtype=torch.float64)
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    assert len(loss) == STEPS
    assert float(((loss - ref_loss).abs() / ref_loss).max()) < 1e-5, (loss, ref_loss)
    val, ref_val = ([r["val_loss"] for r in rs if "val_loss" in r] for rs in (rows, ref_rows))
    assert len(val) == len(ref_val) == 2
    assert max(abs(a - b) / b for a, b in zip(val, ref_val)) < 1e-5

    # The checkpoint holds whole units, gathered from the slices: weights and AdamW moments.
    n_units = cfg.model.n_units
    units, ref_units = assert_final_weights_match(tmp_path, ref_dir, n_units)
    for u in range(n_units):
        ref_opt, opt = ref_units[u]["optim"], units[u]["optim"]
        assert opt["param_groups"] == ref_opt["param_groups"] or [
            {k: v for k, v in g.items() if k != "lr"} for g in opt["param_groups"]] == [
            {k: v for k, v in g.items() if k != "lr"} for g in ref_opt["param_groups"]]
        assert sorted(opt["state"]) == sorted(ref_opt["state"])
        for i, ref_state in ref_opt["state"].items():
            assert float(opt["state"][i]["step"]) == float(ref_state["step"]) == STEPS
            for key in ("exp_avg", "exp_avg_sq"):
                assert rel(opt["state"][i][key], ref_state[key]) < 1e-4, (u, i, key)

    # The simulator replays the executor's ledger calls: replica 0 of each stage, kind by kind.
    plan = run_plan(cfg)
    predicted = simulate(plan, cfg.model, load_profile("cpu-local"), seq_len=cfg.train.seq_len,
                         micro_batch_size=cfg.train.micro_batch_size, dtype=cfg.train.dtype)
    summary = json.loads((tmp_path / "summary.json").read_text())
    grid = RankGrid(pp, dp)
    for s, rank in enumerate(predicted.ranks):
        measured = summary["ledger_at_peak_by_kind_per_rank"][grid.rank(s, 0)]
        assert rank.peak == sum(measured.values()), s
        assert {k: v for k, v in rank.at_peak.items() if v} == {k: v for k, v in measured.items() if v}

    # Together the replicas of each stage hold every unit's masters once (each unit padded to
    # a multiple of dp elements).
    held = sum(rank["masters"] for rank in summary["ledger_at_peak_by_kind_per_rank"])
    sizes = [sum(w.numel() for w in units[u]["weights"].values()) for u in range(n_units)]
    assert held == sum(4 * -(-n // dp) * dp for n in sizes)


def test_sharding_divides_masters_and_optimizer_state(corpus, tmp_path):
    """dp=4: the masters and the AdamW moments per rank are a quarter of an unsharded run's
    (up to the padding of each unit's last slice); views and the full gradient accumulation
    stay whole."""
    peaks = {}
    for shard in (False, True):
        cfg = micro_config(*corpus, steps=2)
        cfg.parallel.dp, cfg.parallel.shard_state = 4, shard
        run_dir = tmp_path / str(shard)
        rows = _run(cfg, run_dir)
        # 2 validation micro-batches over 4 replicas: those without a share join the reduction
        assert "val_loss" in rows[-1]
        peaks[shard] = json.loads((run_dir / "summary.json").read_text())[
            "ledger_at_peak_by_kind_per_rank"]
    n_units = 6
    for r in range(4):
        whole, slice_ = peaks[False][r], peaks[True][r]
        assert abs(slice_["masters"] - whole["masters"] / 4) <= 4 * 4 * n_units
        # moments: 8 bytes per element; step tensors: 4 bytes per piece (at most 3 per unit more)
        assert abs(slice_["optimizer"] - whole["optimizer"] / 4) <= 4 * 4 * n_units + 16 * n_units
        assert slice_["views"] >= whole["masters"]  # the gathered weights, fp32 here
    assert sum(peaks[True][0].values()) < sum(peaks[False][0].values())


@pytest.fixture(scope="module")
def sharded_run(corpus, tmp_path_factory):
    """10 steps sharded over dp=2, checkpointed at steps 5 and 10."""
    cfg = micro_config(*corpus, steps=10)
    cfg.parallel.dp, cfg.parallel.shard_state = 2, True
    cfg.train.checkpoint_every = 5
    run = tmp_path_factory.mktemp("sharded")
    train(cfg, run, progress=False, trace=False)
    return run


@pytest.mark.parametrize("resume_pp,resume_dp,shard", [(1, 2, True), (2, 1, False), (1, 2, False)])
def test_sharded_checkpoint_resumes_under_any_layout(corpus, sharded_run, tmp_path, resume_pp,
                                                     resume_dp, shard):
    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    shutil.rmtree(checkpoint.checkpoint_dir(run, 10))
    cfg = micro_config(*corpus, steps=10)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.shard_state = resume_pp, resume_dp, shard
    train(cfg, run, resume=True, progress=False, trace=False)

    want = {r["step"]: r["loss"] for r in read_metrics(sharded_run / "metrics.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(got) == list(range(1, 11))
    for step in range(6, 11):
        if shard:  # the same plan: the same arithmetic
            assert got[step] == want[step], (step, got[step], want[step])
        else:
            assert abs(got[step] - want[step]) / want[step] < 1e-5, (step, got[step], want[step])
