"""What one walk of a program keeps between its actions, made afresh for every step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ratrain.runtime.saved_activations import SavedActivations
from ratrain.schedule.ir import Action

Key = tuple[int, int]  # (unit, micro-batch)


@dataclass
class StepState:
    batches: list
    step: int  # -1: an evaluation
    training: bool
    recompute: frozenset[int]  # units whose forward keeps only its input
    lr: float = float("nan")  # the step's learning rate (training)
    fold: dict[Key, str] = field(default_factory=dict)  # B/BW -> its fold (unit_major.fold_roles)
    act: dict[Key, torch.Tensor] = field(default_factory=dict)  # unit output (with graph when local)
    inp: dict[Key, torch.Tensor] = field(default_factory=dict)  # detached unit input
    grad: dict[Key, torch.Tensor] = field(default_factory=dict)  # gradient of a unit's output
    saved: dict[Key, SavedActivations] = field(default_factory=dict)
    wgrad: dict[Key, object] = field(default_factory=dict)  # what BI left for BW
    pending: dict[Action, tuple] = field(default_factory=dict)  # start -> (work, tensor)
    losses: list[torch.Tensor] = field(default_factory=list)  # per micro-batch, on the device
    norm: tuple | None = None  # (work, squared norm) between N and WN
    unit_norms: dict[int, object] = field(default_factory=dict)  # unit -> squared norm (WSN)
    syncs: dict[int, object] = field(default_factory=dict)  # unit -> its sync in flight
    grad_norm: torch.Tensor | None = None  # the global norm (unscaled), a device value
    grad_factor: torch.Tensor | None = None  # what U multiplies the gradients by
    found_inf: torch.Tensor | None = None  # float16: 1.0 when the step overflowed
    loss: float = float("nan")  # the step's mean loss, read at E
    read: dict[str, float] = field(default_factory=dict)  # device values read at E
    bound: dict[str, list] = field(default_factory=dict)  # storage name -> tensors (ledger)

    @property
    def n_micro(self) -> int:
        return len(self.batches)

    @property
    def when(self) -> str:
        return f"step {self.step + 1}" if self.training else "validation"

    def bind(self, **storages: list) -> None:
        """Name the tensors of the current action's storages (schedule/ops.py) for its memory
        effects."""
        self.bound.update(storages)

    def unfinished(self, syncing: list[int]) -> list[str]:
        left = sorted(map(str, self.pending)) + [f"sync {u}" for u in syncing]
        left += [f"saved activations {k}" for k in self.saved]
        left += [f"weight gradient {k}" for k in self.wgrad]
        left += ["norm"] if self.norm else []
        left += [f"act {k}" for k in self.act] + [f"grad {k}" for k in self.grad]
        return left
