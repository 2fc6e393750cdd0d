"""The executor's memory ledger over two real steps of a plan, on the CPU: what tests compare
with the simulator's, kind by kind."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ratrain.config import RunConfig
from ratrain.models.presets import get_preset
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate


def small_model():
    """tiny with two blocks."""
    m = get_preset("tiny")
    m.n_layers = 2
    return m


def executor_ledger(cfg: RunConfig, plan, held: set, prepare: Callable | None = None) -> dict:
    """The executor's peak by kind after two steps; `held` collects the run-gradient owners
    the ledger saw; `prepare(engine)` runs once the engine is built."""
    from ratrain.runtime.engine import PipelineEngine

    engine = PipelineEngine(cfg, plan, None, device=torch.device("cpu"))
    if prepare is not None:
        prepare(engine)
    ledger = engine.stage.ledger
    hold = ledger.hold_storage

    def spy(owner, kind, storage, nbytes):
        if owner[0] == "rungrad":
            held.add(owner)
        hold(owner, kind, storage, nbytes)

    ledger.hold_storage = spy
    batches = step_batches(cfg)
    for _ in range(2):
        engine.train_step(batches, 1e-3)
    return {"peak": ledger.peak, **ledger.at_peak}


def step_batches(cfg: RunConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A step's micro-batches of random tokens (seed 0), inputs and targets as the loader
    gives them."""
    t = cfg.train
    w = torch.randint(0, cfg.model.vocab_size, (t.global_batch, t.seq_len + 1),
                      generator=torch.Generator().manual_seed(0))
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
    return list(zip(x.split(t.micro_batch_size), y.split(t.micro_batch_size)))


def assert_simulated_ledger_is(measured: dict, plan, cfg: RunConfig):
    """The simulator's peak and kinds at the peak, on a profile with a host link and memory
    enough, equal the executor's (`measured`) to within 64 bytes; returns the simulated rank."""
    profile = load_profile("h100-80g-ib")
    profile.device = dataclasses.replace(profile.device, memory_bytes=10 ** 12)
    t = cfg.train
    rank = simulate(plan, cfg.model, profile, micro_batch_size=t.micro_batch_size,
                    seq_len=t.seq_len).ranks[0]
    assert abs(rank.peak - measured["peak"]) <= 64, (rank.peak, measured)
    for kind, nbytes in rank.at_peak.items():
        assert abs(nbytes - measured[kind]) <= 64, (kind, rank.at_peak, measured)
    return rank
