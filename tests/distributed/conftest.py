"""Shared set-up for the multi-process tests: a tiny model on a small corpus, cached in tmp."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ratrain.config import RunConfig
from ratrain.data.corpus import stdlib_files
from ratrain.data.tokenizer import load_tokenizer
from ratrain.data.tokens import load_tokens


def micro_config(data_dir: Path, cache_dir: Path, steps: int = 20) -> RunConfig:
    """A model small enough that 4 ranks on 2 cores finish 20 steps in seconds."""
    cfg = RunConfig()
    cfg.model.name = "micro"
    cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.n_kv_heads = 64, 4, 4, 2
    cfg.model.ffn_dim, cfg.model.vocab_size, cfg.model.max_seq_len = 160, 257, 64
    # No q/k/v bias: the k bias has an exactly-zero gradient (softmax ignores a per-query shift), so
    # AdamW turns its rounding noise into full-size steps and no two summation orders agree on it.
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 32, 16, 2
    cfg.train.steps, cfg.train.warmup_steps, cfg.train.eval_every = steps, 3, 10
    cfg.train.eval_batches, cfg.train.lr = 2, 3e-3
    cfg.data.path, cfg.data.cache_dir = str(data_dir), str(cache_dir)
    return cfg


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """A few stdlib files copied into tmp, tokenized once into a tmp cache."""
    root = tmp_path_factory.mktemp("corpus")
    data, cache = root / "text", root / "cache"
    data.mkdir()
    for f in [f for f in stdlib_files() if f.name in ("textwrap.py", "shlex.py", "glob.py")]:
        shutil.copy(f, data / f.name)
    cfg = micro_config(data, cache)
    load_tokens(cfg.data, load_tokenizer("byte"), progress=False)
    return data, cache
