"""The unit-major order (schedule/unit_major.py) computes 1F1B's training run: losses and final
weights within a relative 1e-5 in fp32 over 20 steps, at pp 1 and 2, for several groups and
micro-batch counts, with clipping on (against the single-process reference, which is 1F1B's
run: tests/distributed/test_equivalence.py) and off (against 1F1B's own plan), keeping,
recomputing or offloading activations.

The plans have fp32 views in a window, so the view machinery runs on the CPU; where the state
is host-homed in one process, the units take their GPU path (each run's gradient summed on the
device, then one fold: runtime/run_grads.py), which the CPU runs with plain copies. Forked
ranks take the CPU's own fold, as a CPU run does.
"""

from __future__ import annotations

import json

import pytest
import torch

from ratrain.runtime.launch import launch_local
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.plan import build_plan
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main

from .conftest import STEPS, assert_final_weights_match, micro_config, one_thread

pytestmark = pytest.mark.dist

# (pp, micro-batch size, group, activation per stage, view window, state home)
CASES = [
    (1, 2, 2, ["recompute"], 1, "host"),  # m = 8
    (1, 2, 8, ["offload"], 1, "host"),  # every micro-batch in one group
    (1, 4, 2, ["keep"], 2, "host"),  # m = 4
    (2, 2, 2, ["keep", "recompute"], 1, "device"),
    (2, 2, 4, ["offload", "keep"], 2, "host"),
]


def _run(cfg, run_dir, pp: int, group: int, activation, window, home) -> None:
    plan = build_plan(cfg.model.n_layers, pp, 1, cfg.n_micro, activation=activation if pp > 1
                      else activation[0], view_window=window, state_home=home,
                      micro_batch_group=group, clip=cfg.train.grad_clip > 0)
    run_dir.mkdir(parents=True)
    plan_file = run_dir / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    cfg.parallel.pp, cfg.parallel.state_home = pp, home
    cfg.parallel.plan_file = str(plan_file)
    args = (cfg, str(run_dir), False, False, False)
    if pp > 1:
        launch_local(pp, rank_main, args, error_dir=run_dir / "errors")
        return
    with one_thread():
        rank_main(*args)


def _assert_same_run(run_dir, ref_dir, n_units) -> None:
    ref_rows, rows = read_metrics(ref_dir / "metrics.jsonl"), read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    ref_loss = torch.tensor([r["loss"] for r in ref_rows], dtype=torch.float64)
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    assert float(((loss - ref_loss).abs() / ref_loss).max()) < 1e-5, (loss, ref_loss)
    assert ref_loss[-1] < ref_loss[0] - 0.5  # it trained
    assert_final_weights_match(run_dir, ref_dir, n_units)


def _id(case) -> str:
    pp, mbs, group, activation, window, home = case
    return f"pp{pp}-mbs{mbs}-g{group}-{'+'.join(activation)}-w{window}-{home}"


@pytest.mark.parametrize("case", CASES, ids=map(_id, CASES))
def test_groups_compute_the_reference_run(case, corpus, reference, tmp_path, monkeypatch):
    pp, mbs, group, activation, window, home = case
    if pp == 1 and home == "host":  # the GPU's fold path: a run's sum, then one fold
        monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.train.micro_batch_size = mbs
    _run(cfg, tmp_path / "run", pp, group, activation, window, home)
    _assert_same_run(tmp_path / "run", reference[1], cfg.model.n_units)


@pytest.mark.parametrize("pp,group,activation", [(1, 4, ["keep"]),
                                                 (2, 2, ["recompute", "offload"])])
def test_groups_without_clipping_compute_1f1bs_run(pp, group, activation, corpus, tmp_path,
                                                   monkeypatch):
    if pp == 1:
        monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    runs = {}
    for g in (1, group):
        cfg = micro_config(*corpus, steps=STEPS)
        cfg.train.grad_clip = 0.0
        runs[g] = tmp_path / f"g{g}"
        _run(cfg, runs[g], pp, g, activation, 1, "host")
    _assert_same_run(runs[group], runs[1], cfg.model.n_units)
