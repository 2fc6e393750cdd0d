"""The program IR: one pipeline stage's training step as a flat list of small actions.

An action is `op` + optional `layer` (a global unit index: 0 is the embedding, 1..n the decoder
blocks, n+1 the final norm + head + loss) + optional `mb` (micro-batch). Its text form is the op
code, then the layer, then `.mb`: `F3.0` is the forward of unit 3 on micro-batch 0, `GS3` starts
the gradient sync of unit 3, `E` ends the step. `Action.parse(str(a)) == a` for every action.

Communication actions name the activation by the unit that *produced* it, on both sides:
`SA4.1` on stage s sends unit 4's output for micro-batch 1 and is matched by `RA4.1` on stage
s + 1; `SG4.1` on stage s + 1 sends the gradient of that same tensor back, matched by `RG4.1`.
Every asynchronous op has a start action and a wait action (`W` + the start's code), except
the offload `O`, whose copy the executor tracks itself.

This module is pure data: no torch, no torch.distributed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Op(str, Enum):
    # compute
    FORWARD = "F"
    """Run one unit's forward on one micro-batch; keep what its backward needs (per policy)."""
    BACKWARD = "B"
    """Backward of one unit on one micro-batch; accumulates that unit's parameter gradients."""
    RECOMPUTE = "R"
    """Re-run a unit's forward from its kept input, so the following backward has its graph."""
    # pipeline point-to-point (start + wait)
    SEND_ACT = "SA"
    """Start sending a unit's output activation to the next stage."""
    WAIT_SEND_ACT = "WSA"
    """Wait until that activation send has completed (its buffer may then be freed)."""
    RECV_ACT = "RA"
    """Post the receive of the previous stage's activation (the input of this stage's first unit)."""
    WAIT_RECV_ACT = "WRA"
    """Wait for that activation to arrive."""
    SEND_GRAD = "SG"
    """Start sending the gradient of this stage's input back to the previous stage."""
    WAIT_SEND_GRAD = "WSG"
    """Wait until that gradient send has completed."""
    RECV_GRAD = "RG"
    """Post the receive of the gradient of this stage's output from the next stage."""
    WAIT_RECV_GRAD = "WRG"
    """Wait for that gradient to arrive."""
    # training state of a unit
    GRAD_SYNC = "GS"
    """Start the data-parallel all-reduce of one unit's accumulated gradients."""
    WAIT_GRAD_SYNC = "WGS"
    """Wait for that all-reduce; the unit's gradients are then final and identical on all replicas."""
    GRAD_NORM = "N"
    """Start reducing the stage's squared gradient norm over the pipeline group (for clipping by
    the global norm); needs every gradient of the stage final and synchronized."""
    WAIT_GRAD_NORM = "WN"
    """Wait for that reduction; the clipping coefficient of the step is then known."""
    UPDATE = "U"
    """Optimizer update of one unit (AdamW on its master weights), then zero its gradients."""
    # activation offload: the tensors F u.m saved for B u.m go to the host tier and come back
    OFFLOAD = "O"
    """Start copying the tensors `F u.m` saved for its backward to the host tier. It has no wait
    op: the executor tracks the copy and frees the device copy once the host copy has
    completed."""
    RELOAD = "L"
    """Start copying those tensors back from the host tier to the compute device, for `B u.m`."""
    WAIT_RELOAD = "WL"
    """Wait for that reload; the saved tensors are on the device again and `B u.m` may run."""
    # parameter views: a unit's compute-precision parameters on the compute device
    PREFETCH = "P"
    """Start materializing unit u's compute view (compute dtype, on the compute device) from its
    master weights in their home tier, into a buffer kept from an earlier step where there is
    one (U made it stale). The view is pending until its WP."""
    WAIT_PREFETCH = "WP"
    """Wait for that view; it is then live (F, R and B of the unit may use it) until `X u`."""
    RELEASE = "X"
    """Release unit u's compute view and free its buffer; the master stays in its home tier."""
    STEP_END = "E"
    """End of the optimizer step: reduce the step's loss to every stage and reset per-step state."""


# Which fields each op carries: (has layer, has micro-batch).
_SHAPE: dict[Op, tuple[bool, bool]] = {
    **{op: (True, True) for op in (
        Op.FORWARD, Op.BACKWARD, Op.RECOMPUTE,
        Op.SEND_ACT, Op.WAIT_SEND_ACT, Op.RECV_ACT, Op.WAIT_RECV_ACT,
        Op.SEND_GRAD, Op.WAIT_SEND_GRAD, Op.RECV_GRAD, Op.WAIT_RECV_GRAD,
        Op.OFFLOAD, Op.RELOAD, Op.WAIT_RELOAD,
    )},
    **{op: (True, False) for op in (
        Op.GRAD_SYNC, Op.WAIT_GRAD_SYNC, Op.UPDATE, Op.PREFETCH, Op.WAIT_PREFETCH, Op.RELEASE,
    )},
    Op.GRAD_NORM: (False, False),
    Op.WAIT_GRAD_NORM: (False, False),
    Op.STEP_END: (False, False),
}

WAIT_OF: dict[Op, Op] = {
    Op.SEND_ACT: Op.WAIT_SEND_ACT,
    Op.RECV_ACT: Op.WAIT_RECV_ACT,
    Op.SEND_GRAD: Op.WAIT_SEND_GRAD,
    Op.RECV_GRAD: Op.WAIT_RECV_GRAD,
    Op.GRAD_SYNC: Op.WAIT_GRAD_SYNC,
    Op.GRAD_NORM: Op.WAIT_GRAD_NORM,
    Op.RELOAD: Op.WAIT_RELOAD,
    Op.PREFETCH: Op.WAIT_PREFETCH,
}
"""Asynchronous start op -> the op that waits for it."""

START_OF: dict[Op, Op] = {wait: start for start, wait in WAIT_OF.items()}
"""Wait op -> the start op it waits for."""

_TEXT = re.compile(r"^([A-Z]+)(\d+)?(?:\.(\d+))?$")


@dataclass(frozen=True, slots=True)
class Action:
    op: Op
    layer: int | None = None
    mb: int | None = None

    def __post_init__(self) -> None:
        has_layer, has_mb = _SHAPE[self.op]
        if (self.layer is not None) != has_layer or (self.mb is not None) != has_mb:
            raise ValueError(
                f"{self.op.name} takes {'a layer' if has_layer else 'no layer'} and "
                f"{'a micro-batch' if has_mb else 'no micro-batch'}; got layer={self.layer} mb={self.mb}"
            )

    def __str__(self) -> str:
        text = self.op.value
        if self.layer is not None:
            text += str(self.layer)
        if self.mb is not None:
            text += f".{self.mb}"
        return text

    __repr__ = __str__

    @staticmethod
    def parse(text: str) -> Action:
        m = _TEXT.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r}")
        code, layer, mb = m.groups()
        try:
            op = Op(code)
        except ValueError:
            raise ValueError(f"unknown op {code!r} in {text!r}") from None
        return Action(op, None if layer is None else int(layer), None if mb is None else int(mb))


Program = list[Action]
"""One pipeline stage's actions for one optimizer step, in execution order."""


def format_program(program: Program) -> str:
    return " ".join(str(a) for a in program)


def parse_program(text: str) -> Program:
    return [Action.parse(tok) for tok in text.split()]
