"""Every pipeline x data-parallel layout computes the same training run as one process.

The reference is the plain single-process engine (whole-model autograd, clip_grad_norm_, AdamW);
each layout runs as real processes talking gloo. Per-step losses and the final weights of every
unit must agree to a relative 1e-5 in fp32.
"""

from __future__ import annotations

import json

import pytest
import torch

from ratrain.training.metrics import read_metrics
from ratrain.runtime.launch import launch_local
from ratrain.training.run import rank_main

from .conftest import STEPS, assert_final_weights_match, micro_config

pytestmark = pytest.mark.dist

@pytest.mark.parametrize("pp,dp", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)])
def test_layout_matches_single_process(pp, dp, corpus, reference, tmp_path):
    ref_dir = reference[1]
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.parallel.pp, cfg.parallel.dp = pp, dp
    launch_local(pp * dp, rank_main, (cfg, str(tmp_path), False, False, True),
                 error_dir=tmp_path / "errors")

    ref_rows, rows = read_metrics(ref_dir / "metrics.jsonl"), read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    ref_loss = torch.tensor([r["loss"] for r in ref_rows], dtype=torch.float64)
    loss = torch.tensor([r["loss"] for r in rows], dtype=torch.float64)
    assert float(((loss - ref_loss).abs() / ref_loss).max()) < 1e-5, (loss, ref_loss)
    assert ref_loss[-1] < ref_loss[0] - 0.5  # the run actually trained
    ref_val = [r["val_loss"] for r in ref_rows if "val_loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == len(ref_val) == 2
    assert max(abs(a - b) / b for a, b in zip(val, ref_val)) < 1e-5

    assert_final_weights_match(tmp_path, ref_dir, cfg.model.n_units)

    trace = json.loads((tmp_path / "trace.json").read_text())
    tracks = {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert tracks == set(range(pp * dp))
