"""The checks of parameter views (`P u`, `WP u`, `X u`) and of weights two units compute with
(a tied head reads the embedding's): part of checks.validate."""

from __future__ import annotations

from ratrain.schedule.ir import Program
from ratrain.schedule.ops import COMPUTE_OPS, SPECS, Op
from ratrain.schedule.table import fail

GRADIENT_OPS = (Op.BACKWARD, Op.BACKWARD_WEIGHT)
"""What leaves a unit's weight gradients on its parameters (BI does not)."""


def check_views(programs: list[Program], shared: dict[int, int] | None = None) -> None:
    """Parameter views, per rank and unit. A view is pending from `P u` to `WP u`, then live
    until `X u`. Where a program prefetches a unit's view at all, every F, R and B of that unit
    runs while it is live, and of the unit that computes with it too (`shared`: a tied head
    with the embedding's); P only when the view is neither pending nor live, WP only when it is
    pending, X only when it is live; no view is left pending at the end. A view may stay live
    at the end (resident views). Units never prefetched compute on their masters."""
    for s, program in enumerate(programs):
        viewed = {a.unit for a in program if a.op is Op.PREFETCH}
        # unit -> (state, step it began): "pending", "live" or "released"; absent: never made
        state: dict[int, tuple[str, int]] = {}
        for i, a in enumerate(program):
            u, current = a.unit, state.get(a.unit, ("absent", -1))
            other = (shared or {}).get(a.unit)
            if a.op in COMPUTE_OPS and a.unit in viewed and current[0] != "live":
                why = f"{a} needs unit {a.unit}'s view live"
            elif (a.op in COMPUTE_OPS and other in viewed
                  and (also := state.get(other, ("absent", -1)))[0] != "live"):
                why, u, current = f"{a} computes with unit {other}'s view too", other, also
            elif a.op is Op.PREFETCH and current[0] in ("pending", "live"):
                why = f"{a} prefetches unit {a.unit}'s view again"
            elif a.op is Op.WAIT_PREFETCH and current[0] != "pending":
                why = f"{a} waits for unit {a.unit}'s view"
            elif a.op is Op.RELEASE and current[0] != "live":
                why = f"{a} releases unit {a.unit}'s view"
            else:
                why = ""
            if why:
                fail(programs, f"rank {s}: {why}, but it is {_view_state(u, *current)}",
                      {s: i})
            if SPECS[a.op].view:
                state[a.unit] = (SPECS[a.op].view, i)
        for u, (current, since) in state.items():
            if current == "pending":
                fail(programs, f"rank {s}: unit {u}'s view is prefetched but never waited "
                                f"(no WP{u} after it)", {s: since})


def _view_state(u: int, state: str, since: int) -> str:
    return {
        "absent": "not prefetched before it",
        "pending": f"only pending (P{u} at step {since}, not waited)",
        "live": f"live (since step {since})",
        "released": f"released (X{u} at step {since})",
    }[state]


def check_shared_gradients(programs: list[Program], shared: dict[int, int] | None) -> None:
    """A unit that computes with another's weight (`shared`: a tied head, the embedding's)
    leaves that weight's gradient on the other unit's parameter, where the other unit's own
    backward folds it: the first unit's last weight gradient must come before the other's
    last, or it would miss the step's fold."""
    for s, program in enumerate(programs):
        last = {a.unit: i for i, a in enumerate(program) if a.op in GRADIENT_OPS}
        for reader, owner in (shared or {}).items():
            if reader in last and owner in last and last[reader] > last[owner]:
                fail(programs, f"rank {s}: {program[last[reader]]} leaves a gradient on unit "
                               f"{owner}'s weight after that unit's last backward "
                               f"({program[last[owner]]}), which folds it", {s: last[reader]})
