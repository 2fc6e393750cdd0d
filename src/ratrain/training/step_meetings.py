"""When a run's ranks agree on a step's figures: its loss over every replica, each rank's memory
peaks, which signal asked to stop (Ctrl-C, SIGTERM) if any did.

A synchronous run agrees after every step: its gradients cross the replicas every step anyway,
and one all-gather more costs a round trip. Under --sync diloco the replicas' steps wait on
nothing of each other's between their outer syncs, and a per-step gather would put the links'
round trips back into every inner step (and hold every replica to the slowest, step by step). There each rank keeps
its figures until the replicas meet anyway (an outer sync, a validation, a checkpoint, the last
step) and they cross then, in one all-gather: the metrics rows of the steps between are written
at the meeting, and a stop asked for between waits for it.

Free to drift, a faster replica would get up to H steps ahead and then wait that long in the
outer sync: past --comm-timeout where the replicas' machines differ by a third over a
quarter-hour period, which the per-step reduction never allowed. So they keep pace: after
each step a rank posts a token to its stage's replicas (an all-reduce over gloo, Groups.pace),
which completes once every replica has posted that step's, and waits for the token of the
step AHEAD steps back. No replica runs more than AHEAD steps ahead of another, and replicas
that keep up with each other, give or take AHEAD steps of jitter, never wait: the round trips
run under the steps that follow. (Waiting for the previous step's token cost ~10% of the
tokens/s on a busy 2-core machine, where the replicas' steps jitter.)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ratrain.config import TrainConfig
from ratrain.runtime import timed_comm
from ratrain.schedule.outer_sync import OuterSync

AHEAD = 4
"""The most steps a replica may run ahead of another between meetings: what it may then wait
at the next one is that many of the slower replica's steps."""


@dataclass(frozen=True)
class StepFigures:
    """One rank's figures of one step."""
    loss: float  # its replica's mean loss (synchronous: the run's, the same on every rank)
    peak_memory: int
    ledger_peak: int | None  # None: no ledger on this rank
    rss_growth: int | None  # None: not measured
    stop: int | None  # the signal that asked this rank to stop (SIGINT, SIGTERM), or None
    # float16: its replica's scale after the step and whether the step was skipped; None
    # otherwise (under --sync diloco each replica's own: its overflows are its own)
    loss_scale: float | None = None
    skipped: bool | None = None

    def encode(self) -> list[float]:
        counts = (self.peak_memory, self.ledger_peak, self.rss_growth)
        scaled = ([-1.0, -1.0] if self.loss_scale is None
                  else [float(self.loss_scale), float(bool(self.skipped))])
        return ([self.loss, float(self.stop or 0)] + [-1.0 if v is None else float(v) for v in counts]
                + scaled)

    @classmethod
    def decode(cls, row: list[float]) -> StepFigures:
        counts = [None if v == -1 else int(v) for v in row[2:5]]
        scale, skipped = (None, None) if row[5] == -1 else (row[5], bool(row[6]))
        return cls(row[0], counts[0], counts[1], counts[2], int(row[1]) or None, scale, skipped)


def agreed_stop(met: list[tuple[int, list[StepFigures]]]) -> int | None:
    """The signal that stops the run at a meeting (StepMeetings.add's list), the same on every
    rank, which all see every rank's figures: the first asked for, in step and then rank order.
    A rank that was told of the stop only so has no signal of its own, and stops as the one
    asked does (until 2026-12-04, under torchrun, it ended silently with exit 0)."""
    return next((f.stop for _, figures in met for f in figures if f.stop), None)


MEETS_AT_LEAST_EVERY = 100
"""Steps after which the --sync diloco replicas meet even where nothing else brings them
together: with validation and checkpoints off and a long period (diloco:500), metrics.jsonl,
the progress bar's loss, a Ctrl-C and a loss gone nan waited H steps. One all-gather of a few
bytes a rank per 100 steps: on a 50 ms link ~0.1 s of steps of ~0.5 s or more."""


def meeting_steps(t: TrainConfig, sync: OuterSync | None) -> Callable[[int], bool]:
    """Whether the ranks agree on the figures after a step (0-based): every step, but under
    --sync diloco only where the replicas meet anyway, and at least every
    MEETS_AT_LEAST_EVERY steps."""
    if sync is None:
        return lambda step: True
    return lambda step: (step + 1 == t.steps or (step + 1) % MEETS_AT_LEAST_EVERY == 0
                         or t.evaluates_after(step + 1) or t.saves_after(step + 1)
                         or sync.fragment_due(step) is not None)


def replicas_mean(losses: list[float]) -> float:
    """The run's loss from every rank's: each replica's pp ranks hold its loss, so the mean over
    ranks weighs the replicas (of equal batches) alike. One value when they are all the same
    (a synchronous run's), not its mean, which may differ from it in the last bit."""
    first = losses[0]
    if all(v == first for v in losses):
        return first
    return math.fsum(losses) / len(losses)


class StepMeetings:
    """Each step's figures from every rank, at the steps `meets` names (0-based); between them
    held on each rank. A rank of one process meets itself at every step."""

    def __init__(self, groups, timeout_s: float, meets: Callable[[int], bool]):
        self.groups, self.timeout_s, self.meets = groups, timeout_s, meets
        self.held: list[tuple[int, StepFigures]] = []
        self.pace = groups.pace if groups else None
        self._tokens: deque = deque()  # those of the steps not every replica has ended

    def add(self, step: int, figures: StepFigures) -> list[tuple[int, list[StepFigures]]]:
        """Hold `figures` of `step`; at a meeting, every held step's figures from every rank, in
        step order and rank order (an empty list between meetings)."""
        self._keep_pace(step)
        self.held.append((step, figures))
        if self.groups and not self.meets(step):
            return []
        held, self.held = self.held, []
        if not self.groups:
            return [(s, [f]) for s, f in held]
        # float64 holds byte counts exactly to 2^53 (8 PiB)
        mine = torch.tensor([f.encode() for _, f in held], dtype=torch.float64,
                            device=self.groups.device)
        world = dist.get_world_size()
        out = [torch.empty_like(mine) for _ in range(world)]
        when = f"step {step + 1}"
        timed_comm.wait(dist.all_gather(out, mine, async_op=True), self.timeout_s, when,
                        "the metrics gather", timed_comm.ranks_text(range(world), dist.get_rank()))
        per_rank = torch.stack(out).tolist()  # [rank][held step][field]
        return [(s, [StepFigures.decode(rows[i]) for rows in per_rank])
                for i, (s, _) in enumerate(held)]

    def _keep_pace(self, step: int) -> None:
        """Post this step's token; wait for those more than AHEAD steps back."""
        if self.pace is None:
            return
        self._tokens.append(dist.all_reduce(torch.zeros(1), group=self.pace, async_op=True))
        while self._tokens and (len(self._tokens) > AHEAD or self._tokens[0].is_completed()):
            self._wait(self._tokens.popleft(), f"step {step + 1}")

    def finish(self) -> None:
        """Every token waited for: the replicas all ended the last step."""
        while self._tokens:
            self._wait(self._tokens.popleft(), "end of run")

    def _wait(self, work, when: str) -> None:
        g = self.groups
        timed_comm.wait(work, self.timeout_s, when, "the replicas' pace",
                        timed_comm.ranks_text(g.grid.replica_ranks(g.stage), g.rank))
