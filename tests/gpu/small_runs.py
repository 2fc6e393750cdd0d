"""What the CUDA tests share: a small model's config, and for the multi-GPU ones a text corpus
and a training run's per-step losses."""

from __future__ import annotations

from pathlib import Path

import torch

from ratrain.config import RunConfig


def small_config(dtype: str) -> RunConfig:
    cfg = RunConfig()
    cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.n_kv_heads = 128, 2, 4, 2
    cfg.model.ffn_dim, cfg.model.vocab_size = 344, 257
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    cfg.train.dtype, cfg.train.lr, cfg.train.warmup_steps = dtype, 3e-3, 0
    return cfg


def corpus(tmp_path: Path, monkeypatch) -> Path:
    """A text file of repeated lines (tokenized into tmp_path's cache), with fp32 matmuls
    exact (no TF32), as runs compared to 1e-4 need."""
    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(4000)))
    return text


def run_losses(cfg: RunConfig, run_dir: Path) -> list[float]:
    """`ratrain train` of cfg into run_dir (its own processes); each step's loss."""
    from ratrain.training.metrics import read_metrics
    from ratrain.training.run import train

    train(cfg, run_dir, progress=False, trace=False)
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")]
