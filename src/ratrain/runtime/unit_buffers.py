"""What a unit's training state holds, apart from what it does: the unit's parameters and their
place in the flat buffers, and the masters, optimizer, gradient buffers and compute view that its
layout (runtime/state_layout.py, runtime/sharded_layout.py) makes and the unit state
(runtime/unit_state.py) acts on.

It sits below both so that a layout can name what it fills without importing the unit state,
which holds a layout: the imports run unit_state -> state_layout -> unit_buffers.
"""

from __future__ import annotations

import torch
from torch import nn

from ratrain.runtime.copy_engine import CopyEngine
from ratrain.runtime.memory_ledger import MemoryLedger


class UnitBuffers:
    """`params`: the unit's parameters (its module's own); `home`: where the masters, gradients
    and optimizer state live (None: where it computes); `view_dtype`: compute with a view in
    that dtype (None: with the masters themselves); `device`: where it computes (default: where
    its parameters are). The layout's build fills `masters`, `optimizer`, `grad` and
    `update_grad`."""

    def __init__(
        self,
        params: list[nn.Parameter],
        home: torch.device | None = None,
        *,
        view_dtype: torch.dtype | None = None,
        copies: CopyEngine | None = None,
        ledger: MemoryLedger | None = None,
        device: torch.device | None = None,
    ):
        self.params = params
        self.device = device or (params[0].device if params else None)
        self.home = home or self.device
        self.view_dtype = view_dtype
        self.copies = copies or CopyEngine(self.device or torch.device("cpu"))
        self.ledger = ledger or MemoryLedger()
        # The parameters' place in the flat buffers, and their shapes (a view's, once made).
        self.shapes = [p.shape for p in params]
        self.sizes = [p.numel() for p in params]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(params))]
        self.numel = sum(self.sizes)
        self.masters: list[nn.Parameter] = []  # what the optimizer updates
        self.optimizer: torch.optim.Optimizer | None = None
        self.grad: torch.Tensor | None = None  # the accumulation, fp32, the parameters in order
        self.update_grad: torch.Tensor | None = None  # what the update reads, once synced
        self.view: torch.Tensor | None = None  # the flat view buffer, where the layout makes one
        # Tied embeddings across stages (schedule/tied_sync.py): the parameter whose gradient TS
        # sums with the other stage's copy, and whether it is the copy (the head's, left out of
        # the global norm, which counts the weight once).
        self.tied: int | None = None
        self.tied_copy = False

    def param_slices(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's region of a flat tensor (the parameters in order), shaped like it."""
        return [flat[offset:offset + n].view(shape)
                for shape, offset, n in zip(self.shapes, self.offsets, self.sizes)]

    def empty_view(self) -> None:
        """Point the module's parameters at nothing (the view's memory can go)."""
        self.view = None
        for p in self.params:
            p.data = torch.empty(0, dtype=self.view_dtype, device=self.device)
