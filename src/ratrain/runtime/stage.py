"""A pipeline stage: the units it owns, each with its training state (runtime/unit_state.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ratrain.config import RunConfig
from ratrain.models.hf import load_hf_weights
from ratrain.models.llama import build_unit
from ratrain.runtime import host_grad
from ratrain.runtime.optim import make_optimizer, unit_parameters
from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.memory_ledger import MemoryLedger
from ratrain.runtime.sharded_layout import Sharded
from ratrain.runtime.state_layout import Replicated
from ratrain.runtime.unit_state import UnitState

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ShardOver:
    """The data-parallel group a stage's state is sharded over, and this rank's place in it."""

    group: object
    replica: int
    replicas: int
    grad_lifetime: str = "step"  # how long a unit's full-size gradient lives
    cross: object = None  # hybrid sharding: the replicas holding the same slice in other groups


class Stage:
    """Units [start, stop) of the model, each with its own training state and optimizer.

    `view_units` compute with a view of their masters (the program prefetches and releases it);
    the others compute with the masters themselves, fp32 on the compute device. `state_home`
    places the masters, gradients and optimizer state: "device" or "host" (the CPU), except
    the `device_units`' (PipelinePlan.device_units), which stay on the device; the
    `summed_on_device` units sum their gradients on the device before they fold to the host
    (PipelinePlan.device_grad_sum). With
    `shard`, every unit's state is sharded over the stage's replicas (runtime/sharded_layout.py;
    it lives on the device). One unit-state class serves both (runtime/unit_state.py).
    Compute in a lower precision runs under autocast, so the ops autocast keeps in fp32 stay
    there.
    """

    def __init__(self, cfg: RunConfig, units: range, device: torch.device, modules=None, *,
                 view_units=(), state_home: str = "device", ledger: MemoryLedger | None = None,
                 shard: ShardOver | None = None, device_units=(), summed_on_device=(),
                 host_grad_dtype: str = "float32"):
        self.cfg = cfg
        self.units = units
        self.device = device
        self.dtype = DTYPES[cfg.train.dtype]
        self.ledger = ledger or MemoryLedger()
        self.copies = CopyEngine(device)
        home = torch.device("cpu") if state_home == "host" else device
        owned: set[int] = set()
        self.modules: dict[int, nn.Module] = {}
        self.state: dict[int, UnitState] = {}
        def new_optimizer(params, decay=None):
            return make_optimizer(params, cfg.train, decay)

        for u, m in zip(units, modules) if modules is not None else self._built(cfg, units):
            viewed = shard is not None or u in view_units
            if not viewed:  # computes with its masters: they live where it computes
                m.to(device)
            params = unit_parameters(m, owned)
            if shard and params:
                layout, view_dtype = (Sharded(shard.group, shard.replica, shard.replicas,
                                            shard.grad_lifetime, shard.cross), self.dtype)
            else:
                low = (host_grad_dtype == "bfloat16" and viewed and state_home == "host"
                       and u not in device_units)
                layout = Replicated(device if u in device_units else home,
                                    host_grad.LOW if low else torch.float32)
                view_dtype = self.dtype if viewed else None
            # A viewed unit's masters are copied to their home straight from the host-built
            # module, so its fp32 weights never pass through the device (the whole stage's would
            # otherwise be the device's peak before the first step); its parameters are then
            # empty placeholders on the device, and only its buffers move.
            self.state[u] = UnitState(params, new_optimizer, layout, view_dtype=view_dtype,
                                      copies=self.copies, ledger=self.ledger, device=device,
                                      sums_on_device=u in summed_on_device)
            self.modules[u] = m.to(device)
        self.sharded = shard is not None
        self._share_update_scratch()
        self._mark_tied(cfg)

    def _share_update_scratch(self) -> None:
        """The one fp32 scratch of the units whose host gradient is bf16 (runtime/host_grad.py),
        on the ledger beside their gradients."""
        low = [s for s in self.state.values()
               if s.grad is not None and s.grad.dtype == host_grad.LOW]
        scratch = host_grad.update_scratch([n for s in low for n in s.sizes])
        for s in low:
            s.update_scratch = scratch
        if scratch is not None:
            self.ledger.hold(("gradients", "update scratch"), "gradients", [scratch])

    def _built(self, cfg: RunConfig, units: range):
        """(u, its module) in order, each built in fp32 on the CPU (with its Hugging Face
        weights, --init-from) when its turn comes, after the one before has moved into its
        state: a rank holds one unit's fp32 weights beyond what it keeps. Built all at once,
        a stage's were 27 GB at llama2-7b on each rank, 216 GB of one node's host memory for
        8 ranks, counted by no memory check. A tied head takes the embedding already placed."""
        for u in units:
            m = build_unit(cfg.model, u, cfg.train.seed, embedding=self.modules.get(0))
            if cfg.train.init_from:
                load_hf_weights([m], cfg.model, cfg.train.init_from)
            yield u, m

    def _mark_tied(self, cfg: RunConfig) -> None:
        """Tied embeddings with the embedding and the head on different stages: the weight each
        holds a copy of (schedule/tied_sync.py)."""
        head = cfg.model.n_units - 1
        if not cfg.model.tie_embeddings or (0 in self.units) == (head in self.units):
            return
        if 0 in self.units:
            self.state[0].tied = 0
            return
        state = self.state[head]
        state.tied = [id(p) for p in state.params].index(id(self.modules[head].lm_head.weight))
        state.tied_copy = True

    def autocast(self):
        """Lower-precision compute under autocast; a no-op for fp32."""
        enabled = self.dtype != torch.float32
        return torch.autocast(self.device.type, dtype=self.dtype if enabled else None, enabled=enabled)

    def master_params(self) -> list[nn.Parameter]:
        """What the stage's optimizers update, every unit's, each with its gradient: the fp32
        masters, whole tensors where the state is replicated; where it is sharded, this
        replica's pieces of them (1-D slices, some units' possibly none), so a norm over these
        is this replica's share only and their sizes sum to its slices, not to the model."""
        return [m for s in self.state.values() for m in s.masters]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [s.optimizer for s in self.state.values() if s.optimizer is not None]

    def train(self, mode: bool = True) -> None:
        for m in self.modules.values():
            m.train(mode)

    def weights(self, u: int) -> dict[str, torch.Tensor]:
        """Unit u's state dict with its whole fp32 masters in place of any view (sharded: a
        gather every replica joins)."""
        state = self.state[u]
        masters = dict(zip(map(id, state.params), state.full_masters()))
        return {name: masters.get(id(t), t).detach()
                for name, t in self.modules[u].state_dict(keep_vars=True).items()}

    @torch.no_grad()
    def load_weights(self, u: int, weights: dict[str, torch.Tensor]) -> None:
        """Copy a state dict into unit u's masters (views are made from them when prefetched)."""
        own = self.modules[u].state_dict(keep_vars=True)
        if set(own) != set(weights):
            raise KeyError(f"unit {u}: expected {sorted(own)}, got {sorted(weights)}")
        state = self.state[u]
        name_of = {id(t): name for name, t in own.items()}
        state.load_masters([weights[name_of[id(p)]] for p in state.params])
        params = set(map(id, state.params))
        for name, t in own.items():
            if id(t) not in params:
                t.copy_(weights[name])
