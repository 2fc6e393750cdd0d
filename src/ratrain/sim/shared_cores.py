"""Compute on a node whose ranks share its cores (a CPU profile's `cores`).

Processor sharing: each running job progresses at min(1, cores / busy threads of the node) of
full speed, slowed further by the profile's `contention` as more of the node's cores are busy
(shared caches and memory bandwidth). A stage's job weighs as many ranks as the stage has
replicas on its node, since data-parallel replicas compute at once. Communication between
ranks of the node (gloo over loopback: the copies and reductions of its threads) occupies
cores as well while it runs: the prefetch all-gathers and gradient reductions of a sharded
stage on 2 cores slow its compute by about 6% (the planned runs of docs/benchmarks.md).

A rank may compute on several threads (`threads`: a single process keeps torch's default of
all cores): its job then keeps that many cores busy and, on the t of them it gets, runs
1 + (t - 1) x the profile's `thread_efficiency` times the one-thread speed the profile
measured (1 where the profile has none: linear, the optimistic edge). Contention counts ranks,
not threads: a rank's own threads' is in its measured efficiency.
"""

from __future__ import annotations

import itertools
from typing import Callable


def threads_of_rank(profile, world: int, asked: int | None) -> int:
    """The CPU threads each of `world` ranks computes on, on a HardwareProfile's nodes (a CPU
    profile's `cores`; none: a GPU's, whose ranks' threads are not priced): `asked`
    (--threads), else the node's cores split among the ranks on it, at least one each: every
    core for a rank alone on its node (torch's default for one process), and what
    training/prepare gives ranks that share a node, launched by ratrain or by torchrun."""
    cores = profile.device.cores
    if asked or not cores:
        return asked or 1
    return max(1, cores // max(1, min(world, profile.devices_per_node)))


def thread_speed(cores_got: float, efficiency: float | None) -> float:
    """A rank's speed on the `cores_got` cores it gets, in one thread's: each core beyond the
    first adds `efficiency` of one (None: a whole one)."""
    if cores_got <= 1.0:
        return cores_got
    return 1.0 + (cores_got - 1.0) * (1.0 if efficiency is None else efficiency)


class SharedCores:
    """The running compute jobs of every node; the simulation's event queue drives them."""

    def __init__(self, cores: int, contention: float, node_of: list[int], weight: list[int],
                 now: Callable[[], float], at: Callable[..., None], threads: int = 1,
                 thread_efficiency: float | None = None):
        self.cores, self.contention, self.threads = cores, contention, threads
        self.thread_efficiency = thread_efficiency
        self.node_of, self.weight = node_of, weight
        self._now, self._at = now, at
        self.jobs: dict[int, list] = {}  # job -> [node, remaining work, weight, done]
        # per node, the weight of its running jobs and of its communication in flight, and
        # the rate they make, updated as they change: the planner simulates thousands of
        # plans, and the rates are read at every event
        self._computing: dict[int, int] = {n: 0 for n in set(node_of)}
        self._occupied: dict[int, int] = dict(self._computing)
        self._rates: dict[int, float] = {n: 1.0 for n in self._computing}
        self._ids = itertools.count()
        self._version = 0
        self._settled = 0.0

    def start(self, s: int, seconds: float, done: Callable[[], None]) -> None:
        """Stage s computes `seconds` of full-speed work, then `done` runs."""
        self._settle()
        node, weight = self.node_of[s], self.weight[s]
        self.jobs[next(self._ids)] = [node, seconds, weight, done]
        self._computing[node] += weight
        self._rates[node] = self._rate(node)
        self._reschedule()

    def occupy(self, s: int, start: float, end: float) -> None:
        """Communication of stage s runs on the node's cores from `start` to `end` (on a CPU
        a collective or a transfer between local ranks is copies and reductions by the
        communication threads): one thread per replica of the stage takes its share of the
        cores from the compute jobs. Its own duration is the link's, measured on idle cores."""
        node, weight = self.node_of[s], self.weight[s]

        def arrive() -> None:
            self._settle()
            self._occupied[node] += weight
            self._rates[node] = self._rate(node)
            self._reschedule()

        def leave() -> None:
            self._settle()
            self._occupied[node] -= weight
            self._rates[node] = self._rate(node)
            self._reschedule()

        self._at(start, arrive)
        self._at(end, leave)

    def _rate(self, node: int) -> float:
        """Each running job's speed on `node`, in one thread's: its threads' share of the cores
        (processor sharing, beside the communication threads that occupy them), slowed by the
        contention of the busy cores for caches and memory bandwidth."""
        computing = self._computing[node]
        if not computing:
            return 1.0
        ranks = computing + self._occupied[node]
        shared = min(1.0, (ranks - 1) / (self.cores - 1)) if self.cores > 1 else 0.0
        cores_got = self.threads * min(1.0, self.cores / (computing * self.threads
                                                          + self._occupied[node]))
        return thread_speed(cores_got, self.thread_efficiency) / (1.0 + self.contention * shared)

    def _settle(self) -> None:
        """Advance every running job's remaining work to now."""
        now = self._now()
        elapsed = now - self._settled
        if elapsed > 0 and self.jobs:
            rates = self._rates
            for job in self.jobs.values():
                job[1] -= elapsed * rates[job[0]]
        self._settled = now

    def _reschedule(self) -> None:
        """Schedule the completion of the job that finishes first at today's rates; any change
        to the running set supersedes it."""
        self._version += 1
        if not self.jobs:
            return
        rates = self._rates
        first, soonest = None, 0.0
        for job_id, job in self.jobs.items():  # the first of the soonest, as min() takes
            left = job[1] / rates[job[0]]
            if first is None or left < soonest:
                first, soonest = job_id, left
        job = self.jobs[first]
        finish = self._now() + max(job[1], 0.0) / rates[job[0]]
        self._at(finish, self._job_done, first, self._version)

    def _job_done(self, job_id: int, version: int) -> None:
        if version != self._version:
            return  # superseded: the set of running jobs changed since
        self._settle()
        node, _, weight, done = self.jobs.pop(job_id)
        self._computing[node] -= weight
        self._rates[node] = self._rate(node)
        self._reschedule()
        done()
