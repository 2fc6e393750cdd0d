"""--host-grad-dtype bfloat16 on a GPU (runtime/host_grad.py): the folds cast each gradient on the
device into a pinned bf16 accumulation, the carried update casts it back to fp32 per parameter.
Skipped where there is no CUDA device."""

from __future__ import annotations

import pytest
import torch

from ratrain.models.llama import build_units
from ratrain.runtime.engine import PipelineEngine
from ratrain.schedule.plan import build_plan

from .small_runs import small_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _engine(cfg, group: int, host_grad_dtype: str) -> PipelineEngine:
    plan = build_plan(cfg.model.n_layers, 1, 1, cfg.n_micro, activation="recompute",
                      view_window=1, state_home="host", clip=True, update="carried",
                      micro_batch_group=group, host_grad_dtype=host_grad_dtype)
    return PipelineEngine(cfg, plan, None, device=torch.device("cuda"),
                          modules=build_units(cfg.model, 0))


def _losses(engine, cfg, steps: int = 8) -> list[float]:
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        w = torch.randint(0, 64, (cfg.train.global_batch, cfg.train.seq_len + 1), generator=g)
        batches = list(zip(w[:, :-1].split(cfg.train.micro_batch_size),
                           w[:, 1:].split(cfg.train.micro_batch_size)))
        out.append(engine.train_step(batches, 1e-3).loss)
    return out


@pytest.mark.parametrize("group", [1, 2])
def test_a_bf16_host_gradient_trains_as_the_fp32_one_on_the_gpu(group):
    """bf16 compute, host-homed state, carried updates: the host's accumulation is pinned bf16,
    and the losses stay within 1% of the fp32 accumulation's run, falling."""
    cfg = small_config("bfloat16")
    low, ref = _engine(cfg, group, "bfloat16"), _engine(cfg, group, "float32")
    grads = [s.grad for s in low.stage.state.values() if s.grad is not None]
    assert grads and all(g.dtype == torch.bfloat16 and g.is_pinned() for g in grads)
    want, got = _losses(ref, cfg), _losses(low, cfg)
    assert max(abs(a - b) / a for a, b in zip(want, got)) < 0.01, (want, got)
    assert got[-1] < got[0]
