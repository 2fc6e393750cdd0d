"""Host-homed gradients summed over the replicas on the compute device before they fold to the
host (PipelinePlan.device_grad_sum: how --state-home host runs with --dp > 1 on GPUs, whose
NCCL cannot reduce host memory) compute the run that summing them on the host computes, bit for
bit: each unit's run of backwards is summed in fp32 in the order the host would add it, and the
same sum is all-reduced, only before its fold instead of after. Here the replicas are gloo
processes and the "device" is the CPU, so the path runs for real, fold and all; the host sum it
is held against is the CPU's own path, which tests/distributed/test_unit_major.py holds against
the single-process reference (and so does this test's first case, to 1e-5)."""

from __future__ import annotations

import json

import pytest
import torch

from ratrain.runtime.launch import launch_local
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main

from .conftest import STEPS, assert_final_weights_match, final_units, micro_config

pytestmark = pytest.mark.dist

# (pp, dp, micro-batch size, group, activation, update, clip, device units): micro_config's
# global batch 16
CASES = [
    (1, 2, 2, 4, "recompute", "inline", True, ()),  # 4 micro-batches a replica, one group
    (2, 2, 2, 4, "keep", "inline", False, ()),  # a pipeline: each stage's one group, unit by unit
    (1, 2, 8, 1, "offload", "carried", True, ()),  # one micro-batch a replica; updates carried
    (1, 2, 2, 4, "keep", "carried", True, (0, 5)),  # the first and last units' on the device
]


def _run(cfg, run_dir, pp, dp, group, activation, update, summed, device_units,
         host_grad_dtype="float32") -> dict:
    plan = build_plan(cfg.model.n_layers, pp, dp, cfg.n_micro // dp, activation=activation,
                      view_window=1, state_home="host", micro_batch_group=group,
                      clip=cfg.train.grad_clip > 0, update=update, device_grad_sum=summed,
                      device_units=device_units, host_grad_dtype=host_grad_dtype)
    cfg.parallel.host_grad_dtype = host_grad_dtype
    run_dir.mkdir(parents=True)
    plan_file = run_dir / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.state_home = pp, dp, "host"
    cfg.parallel.plan_file = str(plan_file)
    launch_local(pp * dp, rank_main, (cfg, str(run_dir), False, False, False),
                 error_dir=run_dir / "errors")
    return plan.to_dict()


def _assert_ledger_is_simulated(run_dir, plan, cfg) -> None:
    """Replica 0 of each stage: the executor's ledger at its peak, kind by kind, is the
    simulator's (the runs' sums included, held from a unit's first backward to its WGS)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    measured = summary["ledger_at_peak_by_kind_per_rank"]
    predicted = simulate(plan, cfg.model, load_profile("cpu-local"), seq_len=cfg.train.seq_len,
                         micro_batch_size=cfg.train.micro_batch_size, dtype=cfg.train.dtype)
    grid = RankGrid(plan.pp, plan.dp)
    for s, rank in enumerate(predicted.ranks):
        at_peak = measured[grid.rank(s, 0)]
        assert rank.peak == sum(at_peak.values()), s
        assert ({k: v for k, v in rank.at_peak.items() if v}
                == {k: v for k, v in at_peak.items() if v}), s


def _most_in_flight(program: str) -> int:
    """The most gradient syncs (GS) a program has started and not yet waited for (WGS)."""
    most = now = 0
    for a in program.split():
        now += a.startswith("GS") - a.startswith("WGS")
        most = max(most, now)
    return most


def _id(case) -> str:
    pp, dp, mbs, group, activation, update, clip, device_units = case
    on_device = f"-device{'+'.join(map(str, device_units))}" if device_units else ""
    return (f"pp{pp}-dp{dp}-mbs{mbs}-g{group}-{activation}-{update}-"
            f"{'clip' if clip else 'noclip'}{on_device}")


@pytest.mark.parametrize("case", CASES, ids=map(_id, CASES))
def test_summing_on_the_device_computes_the_host_sums_run(case, corpus, reference, tmp_path):
    pp, dp, mbs, group, activation, update, clip, device_units = case
    runs = {}
    for summed in (True, False):
        cfg = micro_config(*corpus, steps=STEPS)
        cfg.train.micro_batch_size, cfg.train.grad_clip = mbs, 1.0 if clip else 0.0
        runs[summed] = tmp_path / ("device" if summed else "host")
        plan = _run(cfg, runs[summed], pp, dp, group, activation, update, summed, device_units)
        assert plan.get("device_grad_sum", False) == summed
        # summed on the device, each sum is waited after one more compute action, so at most
        # two are on the device at a time; on the host every unit's waits for the flush
        assert [_most_in_flight(p) <= 2 for p in plan["programs"]] == [summed] * pp
        if summed:
            _assert_ledger_is_simulated(runs[summed], PipelinePlan.from_dict(plan), cfg)
    rows, ref = (read_metrics(runs[s] / "metrics.jsonl") for s in (True, False))
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]
    assert [r.get("grad_norm") for r in rows] == [r.get("grad_norm") for r in ref]
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5  # it trained
    n_units = cfg.model.n_units
    summed, host = final_units(runs[True], n_units), final_units(runs[False], n_units)
    for u in range(n_units):
        for name, w in host[u]["weights"].items():
            assert torch.equal(summed[u]["weights"][name], w), (u, name)
    if clip and mbs == 2 and activation == "recompute":  # as the reference: clipping, m of 2
        ref_rows = read_metrics(reference[1] / "metrics.jsonl")
        for row, want in zip(rows, ref_rows):
            assert row["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert_final_weights_match(runs[True], reference[1], n_units)



def test_a_bf16_host_gradient_summed_on_the_device_trains_as_the_fp32_one(corpus, tmp_path):
    """--host-grad-dtype bfloat16 beside device_grad_sum: each unit's step's fp32 sum, summed
    over the replicas, is cast once into the host's bf16 accumulation. The ledger is the
    simulator's (2 bytes a host parameter, the update's scratch) and the losses are the fp32
    accumulation's to within that rounding."""
    runs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = micro_config(*corpus, steps=STEPS)
        runs[dtype] = tmp_path / dtype
        plan = _run(cfg, runs[dtype], 1, 2, 4, "recompute", "carried", True, (), dtype)
        if dtype == "bfloat16":
            _assert_ledger_is_simulated(runs[dtype], PipelinePlan.from_dict(plan), cfg)
    rows, ref = (read_metrics(runs[d] / "metrics.jsonl") for d in ("bfloat16", "float32"))
    for row, want in zip(rows, ref):
        assert row["loss"] == pytest.approx(want["loss"], rel=5e-4)
    assert [r["loss"] for r in rows] != [r["loss"] for r in ref]  # rounded: not the same run
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5
