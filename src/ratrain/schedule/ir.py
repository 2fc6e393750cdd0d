"""The program IR: one pipeline stage's training step as a flat list of small actions.

An action is `op` + optional `unit` (a global unit index: 0 is the embedding, 1..n the decoder
blocks, n+1 the final norm + head + loss) + optional `mb` (micro-batch), as the op's spec in
schedule/ops.py says it takes. Its text form is the op code, then the unit, then `.mb`: `F3.0` is the forward of unit 3 on micro-batch 0, `GS3` starts
the gradient sync of unit 3, `E` ends the step. `Action.parse(str(a)) == a` for every action.

Communication actions name the activation by the unit that *produced* it, on both sides:
`SA4.1` on stage s sends unit 4's output for micro-batch 1 and is matched by `RA4.1` on stage
s + 1; `SG4.1` on stage s + 1 sends the gradient of that same tensor back, matched by `RG4.1`.
What each op means is its spec (schedule/ops.py); every asynchronous op has a start action and
a wait action (`W` + the start's code), except the offload `O`, whose copy the executor tracks
itself.

This module is pure data: no torch, no torch.distributed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ratrain.schedule.ops import SPECS, Op


_TEXT = re.compile(r"^([A-Z]+)(\d+)?(?:\.(\d+))?$")


@dataclass(frozen=True, slots=True)
class Action:
    op: Op
    unit: int | None = None
    mb: int | None = None

    def __post_init__(self) -> None:
        spec = SPECS[self.op]
        if (self.unit is not None) != spec.unit or (self.mb is not None) != spec.mb:
            raise ValueError(
                f"{self.op.name} takes {'a unit' if spec.unit else 'no unit'} and "
                f"{'a micro-batch' if spec.mb else 'no micro-batch'}; got unit={self.unit} mb={self.mb}"
            )

    def __str__(self) -> str:
        text = self.op.value
        if self.unit is not None:
            text += str(self.unit)
        if self.mb is not None:
            text += f".{self.mb}"
        return text

    __repr__ = __str__

    @staticmethod
    def parse(text: str) -> Action:
        m = _TEXT.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r}")
        code, unit, mb = m.groups()
        try:
            op = Op(code)
        except ValueError:
            raise ValueError(f"unknown op {code!r} in {text!r}") from None
        return Action(op, None if unit is None else int(unit), None if mb is None else int(mb))


Program = list[Action]
"""One pipeline stage's actions for one optimizer step, in execution order."""


def format_program(program: Program) -> str:
    return " ".join(str(a) for a in program)


def parse_program(text: str) -> Program:
    return [Action.parse(tok) for tok in text.split()]
