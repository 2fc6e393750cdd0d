"""DiLoCo with the state in host memory over NCCL replicas: the outer deltas in host memory are
summed over the stage's gloo group (Groups.host_replicas), everything else over NCCL. Needs one
GPU per rank; skipped elsewhere (tests/distributed/test_diloco.py runs the same path on gloo)."""

from __future__ import annotations

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.training.metrics import read_metrics
from ratrain.training.run import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank"),
]


def _cfg(text, state_home: str) -> RunConfig:
    cfg = RunConfig()
    cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.n_kv_heads = 128, 2, 4, 2
    cfg.model.ffn_dim, cfg.model.vocab_size = 344, 257
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    cfg.train.lr, cfg.train.warmup_steps, cfg.train.steps = 3e-3, 0, 6
    cfg.train.eval_batches = 0
    cfg.data.path = str(text)
    cfg.parallel.dp, cfg.parallel.sync, cfg.parallel.state_home = 2, "diloco:3", state_home
    return cfg


def test_host_state_diloco_over_nccl_replicas_matches_device_state(tmp_path, monkeypatch):
    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(4000)))
    losses = {}
    for home in ("device", "host"):
        train(_cfg(text, home), tmp_path / home, progress=False, trace=False)
        losses[home] = [r["loss"] for r in read_metrics(tmp_path / home / "metrics.jsonl")]
    assert len(losses["host"]) == 6
    assert max(abs(a - b) / a for a, b in zip(losses["device"], losses["host"])) < 1e-4
    assert losses["host"][-1] < losses["host"][0]
