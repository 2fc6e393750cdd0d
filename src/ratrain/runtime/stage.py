"""A pipeline stage: the units it owns, each with its training state (runtime/unit_state.py)."""

from __future__ import annotations

import torch
from torch import nn

from ratrain.config import RunConfig
from ratrain.models.hf import load_hf_weights
from ratrain.models.llama import build_units
from ratrain.optim import make_optimizer, unit_parameters
from ratrain.runtime.unit_state import UnitState


_AUTOCAST = {"float32": None, "bfloat16": torch.bfloat16}


class Stage:
    """Units [start, stop) of the model, each with its own optimizer.

    Master weights are fp32 on the compute device; with dtype and device equal to the compute
    view's, the view is the master itself (no copy). Lower-precision compute runs under autocast.
    """

    def __init__(self, cfg: RunConfig, units: range, device: torch.device, modules=None):
        self.cfg = cfg
        self.units = units
        self.device = device
        built = modules if modules is not None else build_units(cfg.model, cfg.train.seed, list(units))
        if modules is None and cfg.train.init_from:
            load_hf_weights(built, cfg.model, cfg.train.init_from)  # only this stage's tensors
        self.modules: dict[int, nn.Module] = {u: m.to(device) for u, m in zip(units, built)}
        owned: set[int] = set()
        self.state: dict[int, UnitState] = {}
        for u, m in self.modules.items():
            params = unit_parameters(m, owned)
            self.state[u] = UnitState(params, make_optimizer(params, cfg.train))

    def autocast(self):
        """Lower-precision compute (bf16) under autocast; a no-op for fp32."""
        dtype = _AUTOCAST[self.cfg.train.dtype]
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def all_params(self) -> list[nn.Parameter]:
        return [p for s in self.state.values() for p in s.params]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [s.optimizer for s in self.state.values() if s.optimizer is not None]

    def train(self, mode: bool = True) -> None:
        for m in self.modules.values():
            m.train(mode)
