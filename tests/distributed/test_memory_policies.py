"""Every memory choice of the lifecycle computes the same training run as one process: activation
recovery per stage (keep / recompute / offload), parameter views made within a window and
released, masters on the device or the host, under both policies, pp and dp in {1, 2}.

The plans are built with an explicit view window, so fp32 views (copies of the masters) run the
whole view machinery even on a CPU-only run, where the CLI would make none. The reference is the
plain single-process engine; losses and final weights must agree to a relative 1e-5 over 20 steps.
"""

from __future__ import annotations

import json

import pytest
import torch

from ratrain.training.metrics import read_metrics
from ratrain.runtime.launch import launch_local
from ratrain.schedule.ir import Op
from ratrain.schedule.plan import build_plan
from ratrain.training.run import rank_main

from .conftest import STEPS, assert_final_weights_match, micro_config, one_thread

pytestmark = pytest.mark.dist

# (pp, dp, policy, activation per stage, view window, state home): a covering set in which every
# activation policy meets every stage position, every window both policies where allowed
# (baseline keeps views resident), and each home tier every layout.
CASES = [
    (1, 1, "ratrain", ["offload"], 1, "host"),
    (1, 1, "baseline", ["recompute"], 0, "device"),
    (1, 2, "ratrain", ["keep"], 2, "host"),
    (1, 2, "baseline", ["offload"], 0, "host"),
    (2, 1, "ratrain", ["recompute", "keep"], 1, "device"),
    (2, 1, "ratrain", ["keep", "offload"], 2, "host"),
    (2, 1, "baseline", ["offload", "offload"], 0, "device"),
    (2, 2, "ratrain", ["offload", "recompute"], 2, "device"),
    (2, 2, "ratrain", ["recompute", "offload"], 0, "host"),
    (2, 2, "baseline", ["recompute", "recompute"], None, "host"),
]


def _id(case) -> str:
    pp, dp, policy, activation, window, home = case
    return f"{pp}x{dp}-{policy}-{'+'.join(activation)}-w{window}-{home}"


@pytest.mark.parametrize("case", CASES, ids=map(_id, CASES))
def test_memory_choices_match_single_process(case, corpus, reference, tmp_path):
    pp, dp, policy, activation, window, home = case
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.policy, cfg.parallel.state_home = pp, dp, policy, home
    plan = build_plan(cfg.model.n_layers, pp, dp, cfg.n_micro, policy=policy,
                      activation=activation if pp > 1 else activation[0],
                      view_window=window, state_home=home)
    ops = {a.op for program in plan.programs for a in program}
    assert (Op.OFFLOAD in ops) == ("offload" in activation)
    assert (Op.RELEASE in ops) == bool(window)  # views are released only within a window
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    cfg.parallel.plan_file = str(plan_file)
    run_dir = tmp_path / "run"
    args = (cfg, str(run_dir), False, False, False)
    if pp * dp == 1:
        with one_thread():
            rank_main(*args)
    else:
        launch_local(pp * dp, rank_main, args, error_dir=run_dir / "errors")

    ref_rows, rows = read_metrics(reference[1] / "metrics.jsonl"), read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    ref_loss = torch.tensor([r["loss"] for r in ref_rows], dtype=torch.float64)
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    assert float(((loss - ref_loss).abs() / ref_loss).max()) < 1e-5, (loss, ref_loss)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    ref_val = [r["val_loss"] for r in ref_rows if "val_loss" in r]
    assert len(val) == len(ref_val) and max(abs(a - b) / b for a, b in zip(val, ref_val)) < 1e-5
    assert_final_weights_match(run_dir, reference[1], cfg.model.n_units)
    assert len(rows[-1]["ledger_peak_bytes_per_rank"]) == pp * dp
    # each rank's peaks in a row only where they moved (they only grow), and in the last row
    with_lists = [r for r in rows if "ledger_peak_bytes_per_rank" in r]
    assert with_lists[0] is rows[0] and with_lists[-1] is rows[-1]
    assert len(with_lists) < len(rows)
    lists = [r["ledger_peak_bytes_per_rank"] for r in with_lists]
    assert all(a != b for a, b in zip(lists, lists[1:-1]))
    assert all(x <= y for a, b in zip(lists, lists[1:]) for x, y in zip(a, b))
