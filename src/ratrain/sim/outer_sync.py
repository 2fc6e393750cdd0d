"""What --sync diloco's outer sync costs (schedule/outer_sync.py): `OS u`, the all-reduce of
unit u's outer delta over the stage's replicas (a "sync" on the replicas' links, like GS, but
only in the steps it is due: the simulator prices the step whose program it is given), `WOS u`,
the outer Nesterov step and the merge (memory traffic in the state's tier), and the bytes the
outer state holds (the outer parameters and momentum, fp32, counted as optimizer state) and the
delta in flight. Pure Python."""

from __future__ import annotations

from ratrain.schedule.outer_sync import parse_sync
from ratrain.sim.links import ring

OUTER_STEP_BYTES_PER_PARAM = 40
"""The outer step's memory traffic per parameter: read the summed delta, the momentum, the
outer and local parameters, write the momentum, the outer and the local parameters (fp32; the
delta once more for the division by dp)."""


def delta_bytes(c, u: int) -> int:
    """Unit u's outer delta as it crosses the link (fp32, or bf16 with :bf16)."""
    outer = parse_sync(c.s.sync)
    return (outer.delta_bytes if outer else 4) * c.s.params(u)


def outer_sync_time(c, u: int) -> float:
    """A ring all-reduce of the delta over the stage's dp replicas."""
    return ring(c.s.replicas, delta_bytes(c, u), c.s.dp)


def outer_step_time(c, u: int) -> float:
    return OUTER_STEP_BYTES_PER_PARAM * c.s.params(u) / c.state_bandwidth(u)


def outer_state_owners(c, u: int) -> list[tuple[tuple, str, tuple, int]]:
    """The unit's outer parameters and momentum, where the run has them."""
    if parse_sync(c.s.sync) is None:
        return []
    return [(("outer", u), "optimizer", ("outer", u), 8 * c.s.params(u))]
