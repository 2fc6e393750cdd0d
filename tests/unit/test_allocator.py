"""A CPU rank running a split schedule tells glibc to keep freed memory (runtime/allocator.py),
unless the user tuned malloc; a whole backward's rank leaves malloc as it is."""

import os
import sys

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.runtime import allocator
from ratrain.runtime.engine import PipelineEngine
from ratrain.schedule.plan import build_plan


class _Libc:
    def __init__(self):
        self.set = []

    def mallopt(self, param, value):
        self.set.append((param, value))
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = _Libc()
    monkeypatch.setattr(allocator, "_kept", False)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: fake)
    for key in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(key)
    return fake


def _engine(**schedule):
    cfg = RunConfig()
    cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.n_kv_heads = 32, 2, 2, 2
    cfg.model.ffn_dim, cfg.model.vocab_size = 64, 257
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 16, 4, 2
    plan = build_plan(cfg.model.n_layers, 1, 1, 2, **schedule)
    return PipelineEngine(cfg, plan, None, device=torch.device("cpu"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_split_schedule_keeps_freed_memory_and_a_whole_backward_does_not(libc):
    _engine()
    assert libc.set == []
    _engine(schedule="zbh1", weight_grad="bubble")
    assert libc.set == list(allocator.KEEP)
    _engine(schedule="zbh1", weight_grad="grouped")
    assert libc.set == list(allocator.KEEP)  # once a process


def test_malloc_is_left_as_the_user_tuned_it(libc, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4194304")
    assert not allocator.keep_freed_memory()
    assert libc.set == []
