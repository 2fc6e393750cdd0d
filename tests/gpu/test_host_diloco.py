"""DiLoCo with the state in host memory over NCCL replicas: the outer deltas in host memory are
summed over the stage's gloo group (Groups.host_replicas), everything else over NCCL. Needs one
GPU per rank; skipped elsewhere (tests/distributed/test_diloco.py runs the same path on gloo)."""

from __future__ import annotations

import pytest
import torch

from .small_runs import corpus, run_losses, small_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank"),
]


def test_host_state_diloco_over_nccl_replicas_matches_device_state(tmp_path, monkeypatch):
    text = corpus(tmp_path, monkeypatch)
    losses = {}
    for home in ("device", "host"):
        cfg = small_config("float32")
        cfg.data.path, cfg.train.steps, cfg.train.eval_batches = str(text), 6, 0
        cfg.parallel.dp, cfg.parallel.sync, cfg.parallel.state_home = 2, "diloco:3", home
        losses[home] = run_losses(cfg, tmp_path / home)
    assert len(losses["host"]) == 6
    assert max(abs(a - b) / a for a, b in zip(losses["device"], losses["host"])) < 1e-4
    assert losses["host"][-1] < losses["host"][0]
