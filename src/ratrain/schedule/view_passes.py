"""The parameter views' pass: when each unit's compute view is prefetched (`P u`, `WP u`) from
its master and released (`X u`). It runs last, on finished programs (passes.py's order), and
anchors on the compute actions as the other passes do.
"""

from __future__ import annotations

from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import COMPUTE_OPS, Op
from ratrain.schedule.passes import after_compute, insert_at


def add_views(programs: list[Program], stage_units: list[range],
              window: int | None, shared: dict[int, int] | None = None) -> list[Program]:
    """Parameter views: when each unit's compute view is prefetched (`P u`, `WP u`) from its
    master and released (`X u`). Runs last, on finished programs (E present); it never moves
    what is already placed.

    * window None: nothing is added; the view is the master.
    * window 0 (views resident): `P u` for every unit of the stage in the order of first use,
      then the `WP u` in the same order, at the very start of the program, so the copies are in
      flight together; never released. U made last step's views stale, so every step prefetches
      them again (into the buffer kept from the previous step).
    * window K >= 1: see _windowed_views. At most K + 1 views are live on the stage at any
      point, and all are released before the step's updates. `shared` (unit -> the other unit
      whose view its compute reads too: a tied head, the embedding's) keeps that view from the
      first run that reads it to the last, one view more.
    """
    if window is None:
        return [list(program) for program in programs]
    if window == 0:
        return [_resident_views(program, units) for program, units in zip(programs, stage_units)]
    return [_windowed_views(program, window, shared or {}) for program in programs]


def _resident_views(program: Program, units: range) -> Program:
    """Every unit's P, then every WP, in the order of first use, in front of the program."""
    first_use: dict[int, int] = {}
    for i, a in enumerate(program):
        if a.op in COMPUTE_OPS:
            first_use.setdefault(a.unit, i)
    order = sorted(units, key=first_use.__getitem__)
    return ([Action(Op.PREFETCH, u) for u in order] + [Action(Op.WAIT_PREFETCH, u) for u in order]
            + program)


def _runs(program: Program) -> list[tuple[int, int, int]]:
    """The program's compute actions grouped into runs of consecutive actions on the same unit:
    (unit, index of the run's first compute action, index of its last)."""
    runs: list[tuple[int, int, int]] = []
    for i, a in enumerate(program):
        if a.op not in COMPUTE_OPS:
            continue
        if runs and runs[-1][0] == a.unit:
            runs[-1] = (a.unit, runs[-1][1], i)
        else:
            runs.append((a.unit, i, i))
    return runs


def _view_lifetimes(units: list[int], k: int) -> tuple[list[bool], list[bool]]:
    """For runs on `units` (one entry per run) and window k: whether run r prefetches a fresh
    view, and whether it releases its view after it. A unit that runs again within k + 1 runs
    keeps its view for that run."""
    fresh, release = [], [True] * len(units)
    last: dict[int, int] = {}
    for r, u in enumerate(units):
        kept = u in last and r - last[u] <= k + 1
        if kept:
            release[last[u]] = False
        fresh.append(not kept)
        last[u] = r
    return fresh, release


def _windowed_views(program: Program, k: int, shared: dict[int, int]) -> Program:
    """Views within a window of k runs (see _runs): run r's view is live from before its first
    compute action to after its last.

    `P u` for run r goes after the last compute action of run r - k - 1 (at the program start
    for r <= k), so a view is prefetched at most k runs ahead of its use and its copy overlaps
    the k runs in between; `WP u` right before run r's first compute action, as late as
    possible. `X u` right after run r's last compute action, unless u runs again within the
    next k + 1 runs: then the view stays live and that run gets no P/WP (with the gap exactly
    k + 1, its P would land where this X does, so keeping the view costs no more memory than
    releasing and prefetching it again). Where X and P share a point, X comes first, and both
    come before a WP there; so at most k + 1 views are live (run r's and those prefetched for
    runs r + 1 .. r + k), and every view is released after its unit's last run, before the
    updates. "After" a compute action means after the starts it triggers (see after_compute).

    A view another unit computes with too (`shared`) is live from the first run that reads it
    to the last, as if they were one run: prefetched k runs ahead of the first, released after
    the last.
    """
    runs = _runs(program)
    units = [u for u, _, _ in runs]
    fresh, release = _view_lifetimes(units, k)
    held: dict[int, tuple[int, int]] = {}  # a shared view's unit -> (first, last) reading run
    for v in set(shared.values()):
        reading = [r for r, u in enumerate(units) if v in (u, shared.get(u))]
        if reading:
            held[v] = (reading[0], reading[-1])

    def after(r: int) -> int:
        return 0 if r < 0 else after_compute(program, runs[r][2])

    # (point, X before P before WP, run): the order of what shares a point, as above
    placed: list[tuple[int, int, int, Action]] = []
    for r, (u, first, _) in enumerate(runs):
        if u in held:
            continue
        if fresh[r]:
            placed += [(after(r - k - 1), 1, r, Action(Op.PREFETCH, u)),
                       (first, 2, r, Action(Op.WAIT_PREFETCH, u))]
        if release[r]:
            placed.append((after(r), 0, r, Action(Op.RELEASE, u)))
    for v, (first, last) in held.items():
        placed += [(after(first - k - 1), 1, first, Action(Op.PREFETCH, v)),
                   (runs[first][1], 2, first, Action(Op.WAIT_PREFETCH, v)),
                   (after(last), 0, last, Action(Op.RELEASE, v))]
    at: dict[int, list[Action]] = {}
    for point, _, _, action in sorted(placed, key=lambda p: p[:3]):
        at.setdefault(point, []).append(action)
    return insert_at(program, at)
