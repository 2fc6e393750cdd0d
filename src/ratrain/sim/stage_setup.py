"""What costing one stage's program needs (StageSetup): the model and the micro-batch shape, the
stage's units and their activation choices, where its state lives and how it is sharded, and
the links to its neighbours and its replicas. sim/placement.py makes one per stage of a plan;
sim/stage_costs.py prices the stage's parts from it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ratrain.config import ModelConfig
from ratrain.models.params import unit_param_counts
from ratrain.schedule.outer_sync import OuterSync, parse_sync
from ratrain.sim import unit_costs as uc
from ratrain.sim.links import Link
from ratrain.sim.profile import HardwareProfile

UPDATE_CHUNK = 1 << 22
"""Elements the host update casts from a bf16 gradient at a time (runtime/host_grad.CHUNK)."""


@dataclass
class StageSetup:
    """Everything costing one stage's program needs."""

    profile: HardwareProfile
    model: ModelConfig
    micro_batch_size: int
    seq_len: int
    dtype: str
    n_micro: int
    units: range
    activation: dict[int, str]  # unit -> keep / recompute / offload
    view_units: frozenset[int]  # units whose program prefetches a view
    state_home: str
    dp: int
    pp: int
    p2p_prev: Link | None  # links to the neighbouring stages (None at the ends)
    p2p_next: Link | None
    replicas: Link  # the ring of this stage's replicas
    pipeline: Link  # the ring of one replica's stages
    clip: bool
    shard_state: bool = False  # masters and AdamW state sliced over the dp replicas (ZeRO-style)
    grad_lifetime: str = "step"  # sharded: how long the full-size gradient lives (runnable.py)
    shard_group: int | None = None  # hybrid sharding: replicas per shard group (None: all dp)
    shard_ring: Link | None = None  # hybrid: the ring of replica 0's shard group
    cross_ring: Link | None = None  # hybrid: the ring of the replicas holding replica 0's slice
    sync: str = "step"  # the plan's: "step", or --sync diloco's outer sync (sim/outer_sync.py)
    # --sync diloco:...:islands=K: the ring of replica 0's island (its dp / K neighbouring
    # replicas, which sum gradients every step) and that of the replicas in its place in the
    # other islands (the outer deltas' slices cross it); None without islands
    island_ring: Link | None = None
    across_ring: Link | None = None
    # (unit, micro-batch) of each B/BW -> its fold (schedule/unit_major.fold_roles); None
    # (the planner's tables): the step's mean over groups of `micro_batch_group`
    fold_roles: dict[tuple[int, int], str] | None = None
    micro_batch_group: int = 1
    # units whose gradient the host update thread finishes and measures (SN: carried updates
    # with the global norm), so the walker's fold and norm leave them out
    host_norms: frozenset[int] = frozenset()
    # with state_home "host": the units whose state stays on the device (PipelinePlan's)
    device_units: frozenset[int] = frozenset()
    # tied embeddings across stages: the ring of the replica's first and last stage (TS)
    tied: Link | None = None
    host_grad_dtype: str = "float32"  # what host-homed viewed units accumulate in (PipelinePlan's)

    @cached_property
    def shape(self) -> uc.UnitShape:
        return uc.UnitShape(self.model, self.micro_batch_size, self.seq_len, self.dtype)

    def kind(self, u: int) -> str:
        return uc.unit_kind(self.model, u)

    def params(self, u: int) -> int:
        return self._param_counts[u]

    @cached_property
    def _param_counts(self) -> list[int]:
        """Each unit's parameters: read for most of the stage's actions, priced once."""
        return unit_param_counts(self.model)

    def state_on_host(self, u: int) -> bool:
        """Whether unit u's masters, gradients and AdamW state live on the host."""
        return self.state_home == "host" and u not in self.device_units

    def grad_bytes(self, u: int) -> int:
        """Bytes a parameter of unit u's gradient accumulation takes: 2 for a host-homed
        viewed unit under host_grad_dtype bfloat16, else 4 (fp32)."""
        low = self.host_grad_dtype == "bfloat16" and u in self.view_units
        return 2 if low and self.state_on_host(u) else 4

    @cached_property
    def update_scratch(self) -> int:
        """Bytes of the fp32 buffer the host update casts a bf16 gradient into, a chunk at a
        time (runtime/host_grad.py): the stage's largest such parameter's, at most a chunk's;
        0 without one."""
        sizes = [n for u in self.units if self.grad_bytes(u) == 2
                 for n in uc.param_sizes(self.model, self.kind(u))]
        return 4 * min(max(sizes, default=0), UPDATE_CHUNK)

    @cached_property
    def outer(self) -> OuterSync | None:
        """The plan's outer sync, parsed once: read by each outer sync's and step end's cost."""
        return parse_sync(self.sync)

    @property
    def sync_replicas(self) -> int:
        """The replicas a step's gradients, and a training step's loss, are summed over: all dp
        (synchronous), an island's (islands), 1 (DiLoCo: none); outer_sync.grad_sync_replicas,
        from the plan's sync parsed once."""
        return self.dp if self.outer is None else self.outer.island_size(self.dp)

    @property
    def sync_ring(self) -> Link:
        """The ring of those replicas: the island's, else the stage's."""
        return self.island_ring or self.replicas

    @property
    def shard_replicas(self) -> int:
        """How many replicas a unit's state is sharded over: a hybrid shard group's, else
        those that sum their gradients every step (all dp; with islands, an island's)."""
        return self.shard_group or self.sync_replicas

    @property
    def shard_link(self) -> Link:
        """The ring of those replicas."""
        return self.shard_ring or self.sync_ring

    def shard(self, u: int) -> uc.Shard | None:
        """Replica 0's shard of unit u's state; None where the state is not sharded."""
        if not self.shard_state:
            return None
        if u not in self._shards:  # read by most of a sharded unit's costs and sizes
            self._shards[u] = uc.shard(self.model, u, self.shard_replicas)
        return self._shards[u]

    @cached_property
    def _shards(self) -> dict[int, uc.Shard]:
        return {}
