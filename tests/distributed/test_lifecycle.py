"""The `ratrain` policy computes the same training run as the `baseline` policy, in every layout,
with clipping on and off and in both rank orders; and its trace shows the overlap it is for."""

from __future__ import annotations

import json

import pytest
import torch

from ratrain import checkpoint
from ratrain.training.metrics import read_metrics
from ratrain.runtime.launch import launch_local
from ratrain.training.run import rank_main

from .conftest import micro_config

pytestmark = pytest.mark.dist

STEPS = 10


def _run(corpus, run_dir, pp, dp, policy, clip, rank_order="pp-dp", trace=False):
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.policy = pp, dp, policy
    cfg.parallel.rank_order = rank_order
    cfg.train.grad_clip = 1.0 if clip else 0.0
    launch_local(pp * dp, rank_main, (cfg, str(run_dir), False, False, trace),
                 error_dir=run_dir / "errors")
    ckpt = checkpoint.latest(run_dir)
    units = checkpoint.load_units(ckpt, range(cfg.model.n_units), torch.device("cpu"))
    return read_metrics(run_dir / "metrics.jsonl"), units


@pytest.fixture(scope="module")
def baseline_runs(corpus, tmp_path_factory):
    """Baseline runs in the pp-dp order, made once per (pp, dp, clip) and shared."""
    cache = {}

    def get(pp, dp, clip):
        if (pp, dp, clip) not in cache:
            run_dir = tmp_path_factory.mktemp(f"baseline-{pp}x{dp}-clip{int(clip)}")
            cache[(pp, dp, clip)] = _run(corpus, run_dir, pp, dp, "baseline", clip)
        return cache[(pp, dp, clip)]

    return get


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _assert_same_run(got, want):
    rows, units = got
    ref_rows, ref_units = want
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    ref = torch.tensor([r["loss"] for r in ref_rows], dtype=torch.float64)
    assert float(((loss - ref).abs() / ref).max()) <= 1e-5, (loss, ref)
    assert ref[-1] < ref[0] - 0.5  # the run trained
    for u, state in ref_units.items():
        for name, w in state["weights"].items():
            assert _rel(units[u]["weights"][name], w) <= 1e-5, (u, name)


@pytest.mark.parametrize("clip", [True, False], ids=["clip", "noclip"])
@pytest.mark.parametrize("pp, dp, rank_order", [
    (2, 1, "pp-dp"), (1, 2, "pp-dp"), (2, 2, "pp-dp"), (2, 2, "dp-pp"),
])
def test_ratrain_matches_baseline(pp, dp, rank_order, clip, corpus, baseline_runs, tmp_path):
    got = _run(corpus, tmp_path, pp, dp, "ratrain", clip, rank_order)
    _assert_same_run(got, baseline_runs(pp, dp, clip))
    if clip:  # the clipping really acted: the norm is recorded and exceeds 1 early on
        norms = [r["grad_norm"] for r in got[0]]
        assert all(n is not None for n in norms) and max(norms) > 1.0


def test_baseline_rank_order_changes_nothing(corpus, baseline_runs, tmp_path):
    _assert_same_run(_run(corpus, tmp_path, 2, 2, "baseline", True, "dp-pp"),
                     baseline_runs(2, 2, True))


def _spans(trace: dict, rank: int) -> tuple[list[dict], list[dict]]:
    """(action spans, async spans) of one rank."""
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank]
    return [e for e in spans if e["tid"] == 0], [e for e in spans if e["tid"] > 0]


def _overlaps(a: dict, b: dict) -> bool:
    return a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]


@pytest.mark.parametrize("policy, overlap", [("ratrain", True), ("baseline", False)])
def test_trace_shows_grad_sync_under_backward(policy, overlap, corpus, tmp_path):
    """With dp = 2, `ratrain`'s gradient syncs run under later backwards on the same rank;
    `baseline` starts them only after the last backward. Read from the async track."""
    _run(corpus, tmp_path, 1, 2, policy, True, trace=True)
    trace = json.loads((tmp_path / "trace.json").read_text())
    for rank in (0, 1):
        actions, async_spans = _spans(trace, rank)
        syncs = [e for e in async_spans if e["cat"] == "GS"]
        backwards = [e for e in actions if e["cat"] == "B"]
        assert len(syncs) == 3 * 6  # the last 3 steps' syncs, one per unit (4 blocks + 2)
        assert all(e["dur"] > 0 for e in syncs)
        assert any(_overlaps(s, b) for s in syncs for b in backwards) == overlap
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"actions", "async 1"} <= names
