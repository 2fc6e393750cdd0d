"""The rank grid: which global rank is which (pipeline stage, data-parallel replica).

Pipeline is the outer dimension (rank = stage * dp + replica), so the replicas of one stage are
neighbouring ranks. With one node per stage on a cluster, the heavy gradient all-reduce stays on
the fast links inside a node and only the small activation sends cross the slow ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankGrid:
    pp: int
    dp: int

    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    def rank(self, stage: int, replica: int) -> int:
        return stage * self.dp + replica

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a global rank."""
        return divmod(rank, self.dp)

    def pipeline_ranks(self, replica: int) -> list[int]:
        """Ranks of one replica's pipeline, stage 0 first."""
        return [self.rank(s, replica) for s in range(self.pp)]

    def replica_ranks(self, stage: int) -> list[int]:
        """Ranks that hold the same stage: the data-parallel group of that stage."""
        return [self.rank(stage, r) for r in range(self.dp)]
