"""Shared set-up for the multi-process tests: a tiny model on a small corpus, cached in tmp."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.data.corpus import stdlib_files
from ratrain.data.tokenizer import load_tokenizer
from ratrain.data.tokens import load_tokens
from ratrain.training.run import rank_main

STEPS = 20


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


@pytest.fixture(scope="session")
def reference(corpus, tmp_path_factory):
    """The plain single-process run of micro_config for STEPS steps: every layout and lifecycle
    choice must compute the same run."""
    cfg = micro_config(*corpus, steps=STEPS)
    run_dir = tmp_path_factory.mktemp("reference")
    with one_thread():
        rank_main(cfg, str(run_dir), False, False, False)
    return cfg, run_dir


@contextmanager
def one_thread():
    """Torch on one thread, as every rank runs, for a run in the test's own process: a
    many-core machine's default splits the matmuls differently and moves the final weights by
    2e-5 (seen on 16 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def final_units(run_dir, n_units):
    ckpt = checkpoint.latest(run_dir)
    return checkpoint.load_units(ckpt, range(n_units), torch.device("cpu"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_final_weights_match(run_dir, ref_dir, n_units):
    """Every unit's weights in the run's newest checkpoint have the reference's shapes and
    agree with them to a relative 1e-5; returns both runs' final units (run's, reference's)."""
    units, ref_units = final_units(run_dir, n_units), final_units(ref_dir, n_units)
    for u in range(n_units):
        for name, ref_w in ref_units[u]["weights"].items():
            assert units[u]["weights"][name].shape == ref_w.shape, (u, name)
            assert rel(units[u]["weights"][name], ref_w) < 1e-5, (u, name)
    return units, ref_units


def assert_resumes_exactly(make_config, tmp_path) -> Path:
    """A 6-step run of `make_config()` checkpointed every 3 steps, and a copy of it resumed as
    if it had died after step 3: the copy's steps 4-6 have the first run's losses, bit for bit
    (the same plan: the same arithmetic). Returns the resumed run's directory."""
    from ratrain.training.metrics import read_metrics
    from ratrain.training.run import train

    full, run = tmp_path / "full", tmp_path / "resumed"
    for where, resume in ((full, False), (run, True)):
        if resume:
            shutil.copytree(full, run)
            shutil.rmtree(checkpoint.checkpoint_dir(run, 6))  # as if it had died after step 3
        cfg = make_config()
        cfg.train.steps, cfg.train.checkpoint_every = 6, 3
        train(cfg, where, resume=resume, progress=False, trace=False)
    want = {r["step"]: r["loss"] for r in read_metrics(full / "metrics.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(got) == list(range(1, 7))
    for step in range(4, 7):
        assert got[step] == want[step], (step, got[step], want[step])
    return run


@pytest.fixture(autouse=True)
def _no_run_left_behind():
    """Kill what a failed test's runs (test_failure.start) left running."""
    yield
    import os
    import signal

    from .test_failure import STARTED

    while STARTED:
        proc = STARTED.pop()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
