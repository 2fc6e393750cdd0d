"""Layer partitions of a pipeline: contiguous unit ranges per stage, each with the activation
choice that makes it fit, balanced by the stages' busy time.

A stage's busy time and bytes only grow when it takes another unit, so "can p stages each stay
within T and fit?" is answered by filling stages greedily, and the least such T by bisection.
Stages hold different numbers of micro-batches (1F1B), so the balanced partition is uneven where
memory calls for it: the first stages take fewer units, or recompute more.
"""

from __future__ import annotations

from itertools import combinations
from math import comb

from ratrain.planner.stage_cost import StageEstimate, UnitTable

Partition = list[tuple[int, int, StageEstimate]]

EVERY_PARTITION_UP_TO = 64
"""Models small enough to have at most this many partitions get every one of them."""


def _fit(table: UnitTable, a: int, b: int, s: int, pp: int, limit: float,
         choices: str) -> StageEstimate | None:
    return table.cheapest_fit(a, b, s, pp, limit, choices)


def _greedy(table: UnitTable, pp: int, limit: float, choices: str, most: float,
            from_front: bool = True) -> Partition | None:
    """Fill stages one by one with as many units as stay within `most` seconds busy and fit;
    from the front (the first stages take the most) or from the back."""
    n, m = table.n_units, table.n_micro
    bounds: Partition = []
    edge = 0 if from_front else n
    for i in range(pp):
        s = i if from_front else pp - 1 - i
        left = pp - 1 - i  # stages still to fill after this one
        best = None
        remaining = n - edge if from_front else edge
        for size in range(1, remaining - left + 1):
            a, b = (edge, edge + size) if from_front else (edge - size, edge)
            est = _fit(table, a, b, s, pp, limit, choices)
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


def balanced(table: UnitTable, pp: int, limit: float, choices: str) -> list[Partition]:
    """The partitions (front- and back-filled) with the least bottleneck busy time; [] when
    no partition into `pp` stages fits `limit` bytes per stage."""
    n = table.n_units
    if pp > n:
        return []
    m = table.n_micro
    hi = m * (table.total("forward", 0, n) + table.total("backward", 0, n)
              + (n - 2) * table.recompute[min(1, n - 1)]) + table.total("update", 0, n) + 1.0
    if _greedy(table, pp, limit, choices, hi) is None:
        return []
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _greedy(table, pp, limit, choices, mid) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-6 * hi:
            break
    out = []
    for front in (True, False):
        part = _greedy(table, pp, limit, choices, hi, from_front=front)
        if part is not None and part not in out:
            out.append(part)
    return out


def neighbours(table: UnitTable, part: Partition, limit: float, choices: str) -> list[Partition]:
    """The partitions one unit away: each boundary moved by one where both stages still fit."""
    pp, out = len(part), []
    for i in range(pp - 1):
        (a, b, _), (_, d, _) = part[i], part[i + 1]
        for cut in (b - 1, b + 1):
            if not (a < cut < d):
                continue
            left = _fit(table, a, cut, i, pp, limit, choices)
            right = _fit(table, cut, d, i + 1, pp, limit, choices)
            if left and right:
                out.append(part[:i] + [(a, cut, left), (cut, d, right)] + part[i + 2:])
    return out


def every(table: UnitTable, pp: int, limit: float, choices: str) -> list[Partition] | None:
    """Every partition that fits, or None when there are more than EVERY_PARTITION_UP_TO."""
    n = table.n_units
    if pp > n or comb(n - 1, pp - 1) > EVERY_PARTITION_UP_TO:
        return None
    out = []
    for cuts in combinations(range(1, n), pp - 1):
        edges = [0, *cuts, n]
        stages = [_fit(table, edges[s], edges[s + 1], s, pp, limit, choices) for s in range(pp)]
        if all(stages):
            out.append([(edges[s], edges[s + 1], e) for s, e in enumerate(stages)])
    return out


def candidates(table: UnitTable, pp: int, limit: float, choices: str) -> list[Partition]:
    """What the search simulates for this layout: every partition of a small model; otherwise
    the balanced ones and their neighbours."""
    small = every(table, pp, limit, choices)
    if small is not None:
        return small
    found = balanced(table, pp, limit, choices)
    out = list(found)
    for part in found:
        for near in neighbours(table, part, limit, choices):
            if near not in out:
                out.append(near)
    return out


def least_memory(table: UnitTable, pp: int, choices: str) -> tuple[float, Partition] | None:
    """The partition into `pp` stages whose largest stage (estimated) is smallest, whatever its
    time, and that largest stage's bytes; None when some unit alone overfills the host tier."""
    n = table.n_units
    if pp > n:
        return None
    lo, hi = 0.0, 1.0
    while _greedy(table, pp, hi, choices, float("inf")) is None:
        hi *= 2
        if hi > 1e18:
            return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if _greedy(table, pp, mid, choices, float("inf")) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-4 * hi:
            break
    return hi, _greedy(table, pp, hi, choices, float("inf"))
