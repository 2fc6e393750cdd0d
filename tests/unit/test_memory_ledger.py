"""The memory ledger: bytes counted once per storage, by kind, with their peak; and its peak for a
whole step equals what a hand computation from the model's parts says."""

import torch

from ratrain.config import RunConfig
from ratrain.models.llama import build_units
from ratrain.runtime.engine import PipelineEngine
from ratrain.runtime.memory_ledger import MemoryLedger
from ratrain.schedule.plan import build_plan


def test_a_storage_counts_once_under_its_latest_kind_until_every_owner_lets_go():
    ledger = MemoryLedger()
    y = torch.zeros(1000)  # 4000 bytes
    ledger.hold("out", "buffers", [y, y[:10]])
    ledger.hold("in", "activations", [y.detach()])  # the same storage under another owner
    assert ledger.bytes["buffers"] == 0 and ledger.bytes["activations"] == 4000
    ledger.hold("w", "masters", [torch.zeros(10), None])
    assert ledger.total == 4040 and ledger.peak == 4040
    ledger.release("out")
    assert ledger.total == 4040  # "in" still holds it
    ledger.release("in")
    assert ledger.total == 40 and ledger.peak == 4040
    assert ledger.at_peak["activations"] == 4000
    ledger.reset_peak()
    assert ledger.peak == 40


def _cfg() -> RunConfig:
    cfg = RunConfig()
    cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.model.n_kv_heads = 64, 2, 4, 2
    cfg.model.ffn_dim, cfg.model.vocab_size, cfg.model.max_seq_len = 160, 257, 64
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 32, 4, 2
    return cfg


def _batches(cfg: RunConfig):
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 257, (cfg.train.global_batch, cfg.train.seq_len + 1), generator=g)
    return [(w[i:i + 2, :-1], w[i:i + 2, 1:]) for i in range(0, cfg.train.global_batch, 2)]


def _activation_bytes(modules, batch) -> int:
    """What one micro-batch's forward through every unit keeps: each unit's input and output and
    what autograd saves, each storage once (counted here with our own hooks, not the ledger)."""
    kept: dict[int, torch.Tensor] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t
        return t

    params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    h = batch[0]
    for u, m in enumerate(modules):
        x = h.detach().requires_grad_(h.is_floating_point())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h = m(x)
            if u == len(modules) - 1:
                h = torch.nn.functional.cross_entropy(h.float().flatten(0, 1), batch[1].flatten())
                h = h * 0.5  # the executor's scaled loss is its own tensor
        kept[x.untyped_storage().data_ptr()] = x
        kept[h.untyped_storage().data_ptr()] = h
    return sum(t.untyped_storage().nbytes() for ptr, t in kept.items() if ptr not in params)


def test_ledger_peak_of_a_step_equals_the_hand_computation():
    """One stage, keep: the peak is reached when the last micro-batch's forward is done and
    nothing of its backward has run; 1 micro-batch is in flight (a single stage runs each
    micro-batch's forward and backward back to back). States: fp32 masters, fp32 gradients, and
    AdamW's two moments plus a 4-byte step counter per tensor (they exist from the first update)."""
    cfg = _cfg()
    plan = build_plan(cfg.model.n_layers, 1, 1, 2, clip=False)
    engine = PipelineEngine(cfg, plan, None, device=torch.device("cpu"))
    for _ in range(2):
        engine.train_step(_batches(cfg), 1e-3)
    params = engine.stage.master_params()
    n = sum(p.numel() for p in params)
    states = 4 * n + 4 * n + 8 * n + 4 * len(params)
    modules = build_units(cfg.model, 0)
    assert engine.stage.ledger.peak == states + _activation_bytes(modules, _batches(cfg)[0])
    at_peak = engine.stage.ledger.at_peak
    assert (at_peak["masters"], at_peak["gradients"]) == (4 * n, 4 * n)


def test_recompute_holds_less_and_views_add_their_copies():
    cfg = _cfg()
    peaks = {}
    for name, activation, window in (("keep", "keep", None), ("recompute", "recompute", None),
                                     ("views", "keep", 0)):
        plan = build_plan(cfg.model.n_layers, 1, 1, 2, activation=activation, view_window=window)
        engine = PipelineEngine(cfg, plan, None, device=torch.device("cpu"))
        for _ in range(2):  # the optimizer state exists from the first update on
            engine.train_step(_batches(cfg), 1e-3)
        peaks[name] = engine.stage.ledger
    n = sum(p.numel() for p in engine.stage.master_params())
    assert peaks["recompute"].at_peak["activations"] < peaks["keep"].at_peak["activations"] / 2
    assert peaks["views"].at_peak["views"] == 4 * n  # fp32 views: a copy of every master
    assert peaks["keep"].at_peak["views"] == 0
