"""Layer partitions of a pipeline: contiguous unit ranges per stage, each with the activation
choice that makes it fit, balanced by the stages' busy time.

A stage's busy time and bytes only grow when it takes another unit, so "can p stages each stay
within T and fit?" is answered by filling stages greedily, and the least such T by bisection.
Stages hold different numbers of micro-batches (1F1B), and on a heterogeneous cluster run on
devices of different speed and memory (one unit table per stage), so the balanced partition is
uneven where memory or speed call for it.

Each stage's table carries its device's byte limit; `slack` lowers every limit by that much
(the search asks again with less when a simulated plan overfills).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from math import comb

from ratrain.planner.stage_cost import StageEstimate, cheapest_fit
from ratrain.planner.unit_table import UnitTable

Partition = list[tuple[int, int, StageEstimate]]
Tables = Sequence[UnitTable]  # one per stage

EVERY_PARTITION_UP_TO = 64
"""Models small enough to have at most this many partitions get every one of them."""


def _greedy(tables: Tables, choices: str, most: float, limit_of: Callable[[int], float],
            from_front: bool = True) -> Partition | None:
    """Fill stages one by one with as many units as stay within `most` seconds busy and within
    `limit_of(stage)` bytes; from the front (the first stages take the most) or the back."""
    pp, n, m = len(tables), tables[0].n_units, tables[0].n_micro
    bounds: Partition = []
    edge = 0 if from_front else n
    for i in range(pp):
        s = i if from_front else pp - 1 - i
        left = pp - 1 - i  # stages still to fill after this one
        best = None
        remaining = n - edge if from_front else edge
        for size in range(1, remaining - left + 1):
            a, b = (edge, edge + size) if from_front else (edge - size, edge)
            est = cheapest_fit(tables[s], a, b, s, pp, limit_of(s), choices)
            if est is None or est.busy_s(m) > most:
                break
            best = (a, b, est)
        if best is None:
            return None
        bounds.append(best)
        edge = best[1] if from_front else best[0]
    if edge != (n if from_front else 0):
        return None
    return bounds if from_front else bounds[::-1]


def _within(tables: Tables, slack: float) -> Callable[[int], float]:
    return lambda s: tables[s].limit - slack


def balanced(tables: Tables, choices: str, slack: float = 0.0) -> list[Partition]:
    """The partitions (front- and back-filled) with the least bottleneck busy time; [] when
    none fits."""
    n, pp, m = tables[0].n_units, len(tables), tables[0].n_micro
    if pp > n:
        return []
    limit_of = _within(tables, slack)
    hi = max(m * (t.total("forward", 0, n) + t.total("backward", 0, n)
                  + (n - 2) * t.forward[min(1, n - 1)]) + t.total("update", 0, n)
             for t in tables) + 1.0
    if _greedy(tables, choices, hi, limit_of) is None:
        return []
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _greedy(tables, choices, mid, limit_of) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-6 * hi:
            break
    out = []
    for front in (True, False):
        part = _greedy(tables, choices, hi, limit_of, from_front=front)
        if part is not None and part not in out:
            out.append(part)
    return out


def neighbours(tables: Tables, part: Partition, choices: str, slack: float = 0.0) -> list[Partition]:
    """The partitions one unit away: each boundary moved by one where both stages still fit."""
    pp, out = len(part), []
    limit_of = _within(tables, slack)
    for i in range(pp - 1):
        (a, b, _), (_, d, _) = part[i], part[i + 1]
        for cut in (b - 1, b + 1):
            if not (a < cut < d):
                continue
            left = cheapest_fit(tables[i], a, cut, i, pp, limit_of(i), choices)
            right = cheapest_fit(tables[i + 1], cut, d, i + 1, pp, limit_of(i + 1), choices)
            if left and right:
                out.append(part[:i] + [(a, cut, left), (cut, d, right)] + part[i + 2:])
    return out


def every(tables: Tables, choices: str, slack: float = 0.0) -> list[Partition] | None:
    """Every partition that fits, or None when there are more than EVERY_PARTITION_UP_TO."""
    n, pp = tables[0].n_units, len(tables)
    if pp > n or comb(n - 1, pp - 1) > EVERY_PARTITION_UP_TO:
        return None
    limit_of = _within(tables, slack)
    out = []
    for cuts in combinations(range(1, n), pp - 1):
        edges = [0, *cuts, n]
        stages = [cheapest_fit(tables[s], edges[s], edges[s + 1], s, pp, limit_of(s), choices)
                  for s in range(pp)]
        if all(stages):
            out.append([(edges[s], edges[s + 1], e) for s, e in enumerate(stages)])
    return out


def too_large(tables: Tables, slack: float = 0.0) -> bool:
    """Whether no partition can fit by what a stage holds whole for each of its units,
    whatever else it holds: device-homed state, and views where they stay resident
    (stage_cost.estimate holds both per unit, besides activations and buffers). Their sum over
    the model against the stages' limits together. It spares a large model's layouts the
    partitions' search: llama2-70b on 64 A100s of 40 GB rejected 14,394 of the 23,850 the
    search expanded before its first plan, which came 12-15% sooner (2026-11-29)."""
    distinct = list({id(t): t for t in tables}.values())  # one per kind of device, mostly

    def held(t: UnitTable) -> list[float]:
        resident = t.lifecycle.view_window in (None, 0)
        return [(s if t.states_on_device else 0) + (v if resident else 0)
                for s, v in zip(t.state, t.view)]
    need = sum(map(min, *map(held, distinct))) if len(distinct) > 1 else sum(held(distinct[0]))
    return need > sum(t.limit for t in tables) - slack * len(tables)


def candidates(tables: Tables, choices: str, slack: float = 0.0) -> list[Partition]:
    """What the search simulates for this layout: every partition of a small model; otherwise
    the balanced ones and their neighbours."""
    small = every(tables, choices, slack)
    if small is not None:
        return small
    found = balanced(tables, choices, slack)
    out = list(found)
    for part in found:
        for near in neighbours(tables, part, choices, slack):
            if near not in out:
                out.append(near)
    return out


def fits(tables: Tables, choices: str) -> bool:
    """Whether some partition fits every stage's limit (by the estimate), whatever its time."""
    n, pp = tables[0].n_units, len(tables)
    return pp <= n and _greedy(tables, choices, float("inf"), _within(tables, 0.0)) is not None


def least_excess(tables: Tables, choices: str,
                 below: float | None = None) -> tuple[float, Partition] | None:
    """The partition whose stages overfill their limits the least, whatever its time, and
    that excess in bytes (<= 0: it fits); None when no partition is possible at all, or (with
    `below`) none overfills by less than `below` bytes."""
    n, pp = tables[0].n_units, len(tables)
    if pp > n:
        return None
    unbounded = float("inf")
    if below is not None and _greedy(tables, choices, unbounded, _within(tables, -below)) is None:
        return None
    lo, hi = -min(t.limit for t in tables), 1.0 if below is None else below
    while _greedy(tables, choices, unbounded, _within(tables, -hi)) is None:
        hi = 2 * hi + 1
        if hi > 1e18:
            return None
    for _ in range(80):
        mid = (lo + hi) / 2
        if _greedy(tables, choices, unbounded, _within(tables, -mid)) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-4 * max(abs(hi), 1.0):
            break
    return hi, _greedy(tables, choices, unbounded, _within(tables, -hi))
