"""Host-homed state over NCCL replicas, summed every step: each unit's gradient is summed on the
GPUs before it folds to the host (PipelinePlan.device_grad_sum). Needs one GPU per rank; skipped
elsewhere (tests/distributed/test_device_grad_sum.py runs the same path with gloo ranks on the
CPU, bit for bit against summing on the host)."""

from __future__ import annotations

import json

import pytest
import torch

from .small_runs import corpus, run_losses, small_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank"),
]


def test_host_state_summed_on_the_gpus_matches_device_state(tmp_path, monkeypatch):
    """fp32, dp 2, 2 micro-batches a replica: `--schedule auto` runs them in one group; the
    run's losses are the device-homed run's to 1e-4 (another order of adding, and the host's
    AdamW against the GPU's)."""
    text = corpus(tmp_path, monkeypatch)
    losses = {}
    for home in ("device", "host"):
        cfg = small_config("float32")
        cfg.data.path, cfg.train.steps, cfg.train.eval_batches = str(text), 6, 0
        cfg.parallel.dp, cfg.parallel.state_home = 2, home
        losses[home] = run_losses(cfg, tmp_path / home)
    plan = json.loads((tmp_path / "host" / "plan.json").read_text())
    plan = plan.get("plan", plan)
    assert plan.get("device_grad_sum") and plan.get("micro_batch_group") == 2
    assert len(losses["host"]) == 6
    assert max(abs(a - b) / a for a, b in zip(losses["device"], losses["host"])) < 1e-4
    assert losses["host"][-1] < losses["host"][0]
