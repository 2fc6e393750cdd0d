"""Initialize torch.distributed from the launcher's environment and build the grid's groups."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ratrain.errors import UserError
from ratrain.runtime import timed_comm
from ratrain.schedule.grid import RankGrid

_joined_timeout_s = 300.0
"""The --comm-timeout the world was joined with (join_world), for the start's meetings whose
callers do not carry it (stop_together, training/agreed_plan.py)."""


@dataclass
class Groups:
    grid: RankGrid
    rank: int
    stage: int
    replica: int
    pipeline: dist.ProcessGroup  # this replica's stages
    replicas: dist.ProcessGroup  # this stage's data-parallel group
    device: torch.device
    backend: str
    # One two-rank group per neighbour link and direction. NCCL runs all p2p of one communicator
    # on one stream in issue order, so activations and gradients crossing the same link in
    # opposite directions would wait on each other (1F1B deadlocks); separate groups don't.
    act_from_prev: dist.ProcessGroup | None = None
    act_to_next: dist.ProcessGroup | None = None
    grad_to_prev: dist.ProcessGroup | None = None
    grad_from_next: dist.ProcessGroup | None = None
    # Hybrid sharding: the stage's replicas in this rank's shard group (neighbouring replicas)
    # and those holding the same shard in the other groups. Without it the state is sharded
    # over all the stage's replicas.
    shard_group: dist.ProcessGroup | None = None
    cross_group: dist.ProcessGroup | None = None
    shard_size: int | None = None
    # Tied embeddings across stages: the replica's first and last stage, which hold a copy each
    # of the tied weight (schedule/tied_sync.py); None on the other stages and without the tie.
    tied: dist.ProcessGroup | None = None
    # The stage's replicas over gloo, for DiLoCo's outer sync of state in host memory: NCCL
    # reduces device memory only (made on every backend, so a CPU run takes the GPU's path).
    host_replicas: dist.ProcessGroup | None = None
    # --sync diloco: the stage's replicas over gloo again, for the tokens that keep them within
    # a few steps of each other between outer syncs (training/step_meetings.py: AHEAD)
    pace: dist.ProcessGroup | None = None
    # --sync diloco:...:islands=K: the stage's replicas in this rank's island (its gradients
    # summed every step; the outer sums all-gathered), and those of the same place in the other
    # islands (each carries its slice of the outer delta across); host_* over gloo, for state in
    # host memory (host_replicas is then the group across)
    island: dist.ProcessGroup | None = None
    across: dist.ProcessGroup | None = None
    island_size: int = 1
    host_island: dist.ProcessGroup | None = None

    @property
    def grads(self) -> dist.ProcessGroup:
        """The group a step's gradients (and training losses) are summed over."""
        return self.island or self.replicas

    def outer_group(self, delta: torch.Tensor) -> dist.ProcessGroup:
        """The group an outer delta (or its slice) is summed over: the host group for one in
        host memory."""
        if self.host_replicas is not None and delta.device.type == "cpu":
            return self.host_replicas
        return self.across or self.replicas

    def island_group(self, delta: torch.Tensor) -> dist.ProcessGroup:
        """The group the islands' outer sums are all-gathered in."""
        if self.host_island is not None and delta.device.type == "cpu":
            return self.host_island
        return self.island

    @property
    def shard(self) -> dist.ProcessGroup:
        """The group a unit's state is sharded over."""
        return self.shard_group or self.replicas

    @property
    def shard_replica(self) -> int:
        """This rank's place in that group."""
        return self.replica % self.shard_size if self.shard_size else self.replica

    @property
    def shard_replicas(self) -> int:
        return self.shard_size or self.grid.dp

    @property
    def prev_rank(self) -> int | None:
        return self.grid.rank(self.stage - 1, self.replica) if self.stage > 0 else None

    @property
    def next_rank(self) -> int | None:
        return self.grid.rank(self.stage + 1, self.replica) if self.stage < self.grid.pp - 1 else None


def pick_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def _restart_store(world: int, timeout_s: float) -> dist.Store | None:
    """Under torchrun, the agent's store seen through a prefix of this restart attempt; None
    elsewhere (init_process_group reads the environment).

    torchrun keeps its store across restarts (`--max-restarts`), and with it the addresses the
    ranks of a failed attempt left there: the next attempt's gloo then connected to dead ranks
    (measured, torch 2.13: "Connection refused", or a hang, in 2 of 4 restarts; 0 of 4 with the
    prefix)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"ratrain/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def join_world(backend: str = "auto", timeout_s: float = 300.0,
               failed: str | None = None) -> tuple[str, torch.device]:
    """Join the process group of RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (once: the link probe
    at a run's start joins before the plan exists, and init_groups then finds it joined); the
    backend and this rank's device.

    Under torchrun the ranks first tell each other whether one failed before joining (`failed`:
    its message, from a rank that joins only to say it; stop_together)."""
    global _joined_timeout_s
    backend = pick_backend(backend)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"local rank {local_rank} has no GPU: this machine has "
                            f"{torch.cuda.device_count()}, and NCCL needs one GPU per rank")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout_s),
                                    store=_restart_store(world, timeout_s))
        except RuntimeError as e:  # (DistStoreError: "wait timeout after 2000ms, keys: ...")
            if "timeout" not in str(e).lower() and "timed out" not in str(e).lower():
                raise
            raise timed_comm.CommFailure(timed_comm.late(
                e, timeout_s, "start of training", "joining the world", "a rank")) from None
        _joined_timeout_s = timeout_s
        if "TORCHELASTIC_RUN_ID" in os.environ:
            stop_together(failed)
    return backend, device


class StoppedWithAnother(UserError):
    """Another rank's mistake stopped this one (stop_together): said already, not to be told."""


def stop_together(failed: str | None) -> None:
    """Under torchrun, where each node checks its own disk, data and checkpoints before training:
    every rank says whether it failed (`failed`: its message), and all stop together with the
    first one's, a UserError on every rank. A node that stopped alone left the others waiting
    --comm-timeout (300 s) for it, saying nothing. Collective; each rank takes part twice,
    when it joins the world and right before training (training/run.py), or once, with its
    message, where it failed: at the first where it had not joined yet, else at the second."""
    said = gathered_at_start(failed, "the ranks' word on their checks")
    first = next(((r, m) for r, m in enumerate(said) if m), None)
    if first and first[0] != dist.get_rank():
        raise StoppedWithAnother(f"rank {first[0]} stopped before training: {first[1]}")
    if failed:
        raise UserError(failed)


def gathered_at_start(value, action: str) -> list:
    """Every rank's `value` (picklable), in rank order, waited for --comm-timeout (the world's,
    join_world's): a peer still preparing (tokenizing its data) is told as late, in one line,
    not by gloo's traceback. Collective; NCCL's on the device join_world set."""
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    return timed_comm.gather_at_start(value, _joined_timeout_s, action, device)


def init_groups(grid: RankGrid, backend: str = "auto", timeout_s: float = 300.0,
                shard_group: int | None = None, tied: bool = False,
                host_outer_sync: bool = False, paced: bool = False,
                island_size: int = 1) -> Groups:
    """Join the process group described by RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (set by our
    local launcher or by torchrun) and create every pipeline and replica group. `timeout_s`
    bounds joining and every collective the backend times itself.

    new_group is collective over the whole world, so every rank creates every group in the same
    order and keeps its own. `shard_group`: hybrid sharding's group size (groups of that many
    neighbouring replicas of each stage, and the groups across them). `tied`: tied embeddings
    cross the stages (each replica's first and last stage get a group of their own).
    `host_outer_sync`: DiLoCo with state in host memory (each stage's replicas get a gloo group,
    Groups.host_replicas). `paced`: --sync diloco (each stage's replicas get a gloo group for
    their pace, Groups.pace). `island_size`: --sync diloco's islands of that many
    neighbouring replicas (Groups.island and Groups.across; 1: none).
    """
    world = int(os.environ["WORLD_SIZE"])
    if world != grid.world_size:
        raise RuntimeError(f"WORLD_SIZE={world} but pp x dp = {grid.world_size}")
    backend, device = join_world(backend, timeout_s)
    rank = dist.get_rank()
    stage, replica = grid.coords(rank)
    pipeline = replicas = None
    for r in range(grid.dp):
        g = dist.new_group(grid.pipeline_ranks(r))
        if r == replica:
            pipeline = g
    for s in range(grid.pp):
        g = dist.new_group(grid.replica_ranks(s))
        if s == stage:
            replicas = g
    groups = Groups(grid, rank, stage, replica, pipeline, replicas, device, backend)
    for r in range(grid.dp):
        for s in range(grid.pp - 1):
            link = [grid.rank(s, r), grid.rank(s + 1, r)]
            act, grad = dist.new_group(link), dist.new_group(link)
            if r == replica and s == stage:
                groups.act_to_next, groups.grad_from_next = act, grad
            if r == replica and s + 1 == stage:
                groups.act_from_prev, groups.grad_to_prev = act, grad
    if tied and grid.pp > 1:
        for r in range(grid.dp):
            ends = [grid.rank(0, r), grid.rank(grid.pp - 1, r)]
            g = dist.new_group(ends)
            if r == replica and stage in (0, grid.pp - 1):
                groups.tied = g
    if island_size > 1:
        groups.island_size = island_size
        groups.island, groups.across = _neighbours(grid, stage, replica, island_size)
        # --shard-state shards an island's state over the island (the islands do not sum
        # their gradients every step: no cross group)
        groups.shard_group, groups.shard_size = groups.island, island_size
        if host_outer_sync:
            groups.host_island, groups.host_replicas = _neighbours(
                grid, stage, replica, island_size, "gloo")
    elif host_outer_sync and grid.dp > 1:
        for s in range(grid.pp):
            g = dist.new_group(grid.replica_ranks(s), backend="gloo")
            if s == stage:
                groups.host_replicas = g
    if paced and grid.dp > 1:
        for s in range(grid.pp):
            g = dist.new_group(grid.replica_ranks(s), backend="gloo")
            if s == stage:
                groups.pace = g
    if shard_group:
        groups.shard_size = shard_group
        groups.shard_group, groups.cross_group = _neighbours(grid, stage, replica, shard_group)
    return groups


def _neighbours(grid: RankGrid, stage: int, replica: int, size: int, backend: str | None = None):
    """Per stage, its groups of `size` neighbouring replicas (hybrid sharding's shard groups,
    DiLoCo's islands) and the groups across them (the replicas of the same place in each):
    this rank's of each. Collective."""
    island = across = None
    for s in range(grid.pp):
        ranks = grid.replica_ranks(s)
        for k in range(0, grid.dp, size):
            g = dist.new_group(ranks[k:k + size], backend=backend)
            if s == stage and k <= replica < k + size:
                island = g
        for i in range(size):
            g = dist.new_group(ranks[i::size], backend=backend)
            if s == stage and replica % size == i:
                across = g
    return island, across
