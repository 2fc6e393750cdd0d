"""What --sync diloco's outer sync costs (schedule/outer_sync.py): `OS u`, the all-reduce of
unit u's outer delta over the stage's replicas (a "sync" on the replicas' links, like GS, but
only in the steps it is due: the simulator prices the step whose program it is given), `WOS u`,
the outer Nesterov step and the merge (memory traffic in the state's tier), and the bytes the
outer state holds (the outer parameters and momentum, fp32, counted as optimizer state) and the
delta in flight.

With islands (`:islands=K`, islands of I = dp / K neighbouring replicas) each replica of an
island carries slice j of the delta (1/I of it, the delta padded to a multiple of I) across:
`OS u` is the all-reduce of that slice over the K replicas in its place in the islands (the
across ring), and `WOS u` first all-gathers the summed slices within the island (the island
ring), blocking, before the outer step.

The delta in flight, in the ledger (storage `outer_delta`, OS u to WOS u, in the state's
tier): the whole delta as it crosses (fp32, or bf16), with islands padded to a multiple of I;
the runtime sums its slice in place and gathers the island's sums back into it
(runtime/outer_sync.py). Left out, as the executor's ledger leaves it: WOS u's copy of the
replica's summed slice that the all-gather sends from (1/I of the delta, for the gather only).
Pure Python."""

from __future__ import annotations

from ratrain.sim.links import ring, ring_half

OUTER_STEP_BYTES_PER_PARAM = 40
"""The outer step's memory traffic per parameter: read the summed delta, the momentum, the
outer and local parameters, write the momentum, the outer and the local parameters (fp32; the
delta once more for the division by the workers)."""


def _held(c, u: int) -> int:
    """Elements of unit u's local (and outer) state a replica holds: all its parameters, or
    sharded within the island, its slice (S, the last one's padding included)."""
    shard = c.s.shard(u)
    return shard.size if shard else c.s.params(u)


def delta_bytes(c, u: int) -> int:
    """Unit u's whole outer delta as the runtime holds it (fp32, or bf16 with :bf16), padded
    to a multiple of the island's replicas (sharded: its slice's): the ledger's
    `outer_delta`."""
    island = 1 if c.s.shard_state else c.s.sync_replicas
    padded = -(-_held(c, u) // island) * island
    return (c.s.outer.delta_bytes if c.s.outer else 4) * padded


def outer_sync_time(c, u: int) -> float:
    """A ring all-reduce of the delta over the stage's dp replicas; with islands, of the
    replica's slice (sharded: of its shard's delta) over the K replicas in its place in the
    islands (the across ring)."""
    island = c.s.sync_replicas  # an island's replicas (1 without islands)
    if island == 1:
        return ring(c.s.replicas, delta_bytes(c, u), c.s.dp)
    carried = delta_bytes(c, u) if c.s.shard_state else delta_bytes(c, u) / island
    return ring(c.s.across_ring or c.s.replicas, carried, c.s.dp // island)


def outer_gather_time(c, u: int) -> float:
    """With islands, WOS u's all-gather of the summed slices within the island (a ring
    all-gather of the whole padded delta over the island's replicas); 0 without, and with
    sharded state (each replica steps its own shard)."""
    if c.s.shard_state:
        return 0.0
    return ring_half(c.s.sync_ring, delta_bytes(c, u), c.s.sync_replicas)


def outer_step_time(c, u: int) -> float:
    return OUTER_STEP_BYTES_PER_PARAM * _held(c, u) / c.state_bandwidth(u)


def outer_state_owners(c, u: int) -> list[tuple[tuple, str, tuple, int]]:
    """The unit's outer parameters and momentum, where the run has them: owned apart from
    the delta in flight, whose owner ("outer", u) WOS u releases (until 2026-11-29 they shared
    it, and the simulated ledger dropped the outer state at WOS)."""
    if c.s.outer is None:
        return []
    return [(("outer_state", u), "optimizer", ("outer", u), 8 * _held(c, u))]
