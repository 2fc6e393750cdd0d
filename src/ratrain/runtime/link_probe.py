"""The link probe at the start of a multi-node run: a few timed all-reduces over each stage's
replicas and sends between neighbouring stages, of a few sizes, over the links the run's
layout will use. `--schedule auto` then simulates on these figures instead of a preset's
(training/link_profile.py). Every rank ends with the same figures (the slowest rank's), so
every rank chooses the same plan."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ratrain.schedule.grid import RankGrid

SIZES = (1 << 16, 1 << 20, 1 << 22)
"""64 KiB, 1 MiB and 4 MiB: latency, then bandwidth (4 MiB is about 0.7 s at 50 Mbit/s)."""
REPEATS = 2
"""Timed repeats per size after one untimed (connections, buffers); the fastest counts."""


@dataclass
class Probe:
    sizes: list[int]  # bytes
    rings: list[list[float]]  # per stage: an all-reduce over its replicas, seconds per size
    hops: list[list[float]]  # per hop s -> s + 1: a send one way, seconds per size
    seconds: float  # the probe's own time on this rank


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def probe(grid: RankGrid, device: torch.device, sizes=SIZES, repeats: int = REPEATS) -> Probe:
    """Measure this layout's links (the world must be joined; collective over every rank)."""
    t0 = time.perf_counter()
    rank = dist.get_rank()
    stage, replica = grid.coords(rank)
    # new_group is collective over the world: every rank makes every stage's group
    rings = [dist.new_group(grid.replica_ranks(s)) for s in range(grid.pp)]
    times = torch.zeros(grid.pp + grid.pp - 1, len(sizes), dtype=torch.float64)
    if grid.dp > 1:  # every stage's replicas at once, as a step's syncs may run
        for i, n in enumerate(sizes):
            buf = torch.ones(n // 4, dtype=torch.float32, device=device)
            times[stage, i] = _timed(lambda: dist.all_reduce(buf, group=rings[stage]), device,
                                     repeats)
    # hops with an even first stage, then odd: no rank is in two hops at once
    for parity in (0, 1):
        for s in range(parity, grid.pp - 1, 2):
            if stage not in (s, s + 1):
                continue
            first = stage == s  # sends first; the peer echoes, so a round trip is two sends
            peer = grid.rank(s + 1 if first else s, replica)
            for i, n in enumerate(sizes):
                buf = torch.ones(n // 4, dtype=torch.float32, device=device)

                def ping_pong():
                    for turn in ((dist.send, dist.recv) if first else (dist.recv, dist.send)):
                        turn(buf, peer)
                times[grid.pp + s, i] = _timed(ping_pong, device, repeats) / 2
    # the slowest rank's figure for every link, on every rank
    shared = times.to(device)
    dist.all_reduce(shared, op=dist.ReduceOp.MAX)
    rows = shared.cpu().tolist()
    return Probe(list(sizes), rows[:grid.pp] if grid.dp > 1 else [], rows[grid.pp:],
                 time.perf_counter() - t0)
