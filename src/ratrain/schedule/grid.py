"""The rank grid: which global rank is which (pipeline stage, data-parallel replica).

Two placements, named outer-to-inner like a shape:

* "pp-dp" (rank = stage * dp + replica): the replicas of one stage are neighbouring ranks. With
  one node per stage, the heavy gradient all-reduce stays on the fast links inside a node and
  only the activation sends cross the slow ones.
* "dp-pp" (rank = replica * pp + stage): the stages of one replica are neighbours. With one
  node per replica, the pipeline sends stay inside a node and the all-reduce crosses.

Launchers (ours and torchrun) give neighbouring ranks to one node, so the order picks which
traffic crosses the links between nodes. It never changes the math.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.schedule.plan import RANK_ORDERS


@dataclass(frozen=True)
class RankGrid:
    pp: int
    dp: int
    order: str = "pp-dp"

    def __post_init__(self) -> None:
        if self.order not in RANK_ORDERS:
            raise ValueError(f"rank order must be one of {', '.join(RANK_ORDERS)}, got {self.order!r}")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    def rank(self, stage: int, replica: int) -> int:
        if self.order == "pp-dp":
            return stage * self.dp + replica
        return replica * self.pp + stage

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a global rank."""
        if self.order == "pp-dp":
            return divmod(rank, self.dp)
        replica, stage = divmod(rank, self.pp)
        return stage, replica

    def pipeline_ranks(self, replica: int) -> list[int]:
        """Ranks of one replica's pipeline, stage 0 first."""
        return [self.rank(s, replica) for s in range(self.pp)]

    def replica_ranks(self, stage: int) -> list[int]:
        """Ranks that hold the same stage: the data-parallel group of that stage."""
        return [self.rank(stage, r) for r in range(self.dp)]

    def largest_per_stage(self, per_rank: list[int]) -> list[int]:
        """The largest of each stage's replicas' values, given by rank."""
        return [max(per_rank[r] for r in self.replica_ranks(s)) for s in range(self.pp)]
