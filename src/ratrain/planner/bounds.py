"""Lower bounds on a plan's step time from its stages' estimates (planner/stage_cost.py), for
the search's pruning: no plan of these stages can beat them, so pruning never loses the best.

Three, from loosest to tightest: `pipeline_bound` (a layout, before any partition),
`lower_bound` (a partition, closed form) and `pipeline_path` (a partition, its schedule's
order walked stage by stage). Each holds for the schedule the plan runs: 1F1B's whole
backwards, or ZB-H1's split ones (`split`: BI, then BW wherever the placement puts it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ratrain.planner.stage_cost import StageEstimate
from ratrain.schedule.builders import one_f_one_b_in_flight, one_f_one_b_order, zbh1_order
from ratrain.schedule.ir import Op
from ratrain.schedule.weight_grads import deferral_lag, is_bubble


def lower_bound(estimates: list[StageEstimate], n_micro: int, tail_s: float = 0.0,
                lead_s: Sequence[float] | None = None,
                collectives_s: Sequence[float] | None = None,
                deferred: Sequence[int] | None = None) -> float:
    """A step can end no sooner than this (seconds); communication, copies and shared cores
    only add time. Stage 0's last backward comes after every other stage's, and after
    `tail_s` more (its last sync and updates) the step ends. Stage s computes nothing before
    `lead_s[s]` (sharded state: the all-gather of its first unit's view; default 0), so the
    paths below that start at stage 0's first forward start no sooner than `lead_s[0]`, and
    stage s's own work no sooner than `lead_s[s]`. That last backward is no sooner than, for
    each stage s:

    - everything of s on its one walker (every forward, recomputation and backward), begun
      after the stages before it ran their forward of micro-batch 0, followed by the
      backwards of the last micro-batch on the stages before s;
    - micro-batch 0's forward through every stage and backward back to s, then what s
      still has to do: every backward, the recomputations but the first (each is placed
      right before its backward, so only the first can run before a gradient arrives), the
      forwards after its min(m, p - s) warm-up ones; then the backwards before s.

    Split backwards (ZB-H1: the estimates' `weight_s`): the backwards that follow are the input
    halves only, and `deferred[s]` of s's weight halves (default: all) may run after its last
    input half, beside them (`stage_deferrals`); the gradient reaches s after the input halves
    of the stages after it.

    Apart from these, every stage ends its own work and its updates before the step ends (E
    waits for every stage); stage 0's tail is not added to that. And stage s's collectives
    over its replicas (`collectives_s[s]`, sharded state: its gradient syncs, m per unit where
    each micro-batch's gradient is reduce-scattered, and its views' all-gathers) run one after
    the other on its links within the step.
    """
    m, pp = n_micro, len(estimates)
    lead = lead_s or [0.0] * pp
    split = any(e.weight_s for e in estimates)
    forward_all = sum(e.forward_s for e in estimates)

    def chain(e: StageEstimate) -> float:  # what a gradient waits for on a stage
        return e.backward_s - e.weight_s if split else e.backward_s

    best, alone, before_f, before_b = 0.0, 0.0, 0.0, 0.0
    after = sum(chain(e) for e in estimates)
    for s, e in enumerate(estimates):
        after -= chain(e)  # the backwards (split: input halves) of the stages after s
        own = m * (e.forward_s + e.backward_s + e.recompute_s)
        # BWs that may run beside the stages before s
        overlapped = min(m, deferred[s] if deferred else m) * e.weight_s if split else 0.0
        warm = one_f_one_b_in_flight(s, pp, m)  # forwards before its first backward
        first_gradient = lead[0] + forward_all + after
        rest = m * e.backward_s + (m - 1) * e.recompute_s + (m - warm) * e.forward_s
        best = max(best, max(lead[0] + before_f, lead[s]) + own - overlapped + before_b,
                   first_gradient + rest - overlapped + before_b)
        # s's own work and updates: stage 0's tail (its last sync, its updates) need not
        # follow them (on stage 0 it would count the updates twice)
        alone = max(alone, lead[s] + own + e.update_s)
        before_f += e.forward_s
        before_b += chain(e)
    return max(best + tail_s, alone, max(collectives_s or [0.0]))


def stage_orders(pp: int, n_micro: int, weight_grad: str | None) -> list[list[tuple[Op, int]]]:
    """Each stage's compute in whole micro-batches, in the order its program runs it: 1F1B's
    F and B (weight_grad None); ZB-H1's F, BI and BW ("bubble", "bubble:K"); ZB-H1's F and BI with every
    BW after the stage's last BI ("grouped": on a stage, the unit groups that may come
    earlier run where the stage's remaining BIs would, the same walker time after the last
    gradient arrives)."""
    if weight_grad is None:
        return [[(Op.FORWARD if forward else Op.BACKWARD, i)
                 for forward, i in one_f_one_b_order(s, pp, n_micro)] for s in range(pp)]
    if is_bubble(weight_grad):
        return [list(zbh1_order(s, pp, n_micro, deferral_lag(weight_grad, s)))
                for s in range(pp)]
    orders = [list(zbh1_order(s, pp, n_micro)) for s in range(pp)]
    return [[x for x in order if x[0] is not Op.BACKWARD_WEIGHT]
            + [(Op.BACKWARD_WEIGHT, i) for i in range(n_micro)] for order in orders]


@functools.cache  # the search asks once per layout, hundreds of thousands of times
def stage_deferrals(weight_grad: str | None, pp: int, n_micro: int) -> tuple[int, ...] | None:
    """How many of its BWs each stage runs after its last BI: a bubble placement's lag
    (`zbh1_order`), every one where they are grouped; None where the backward is whole."""
    if weight_grad is None:
        return None
    if is_bubble(weight_grad):
        return tuple(min(n_micro, deferral_lag(weight_grad, s)) for s in range(pp))
    return (n_micro,) * pp


def pipeline_path(estimates: list[StageEstimate], n_micro: int, lead_s: Sequence[float],
                  hop_s: Sequence[float], tail_s: float = 0.0,
                  weight_grad: str | None = None) -> float:
    """A tighter bound than `lower_bound`, at O(stages x micro-batches): the earliest stage 0
    can end its last backward when each stage runs its forwards and backwards in its
    schedule's order (`stage_orders`: 1F1B's is min(p - s - 1, m) warm-up forwards, then one
    forward and one backward, then the cool-down backwards) on its one walker, a forward no
    sooner than the previous stage's forward of that micro-batch plus `hop_s[s - 1]` (the
    activation's transfer), a backward (split: its input half) no sooner than the next
    stage's backward of it plus `hop_s[s]` (the gradient's), a weight half after its input
    half, and the stage's first forward no sooner than `lead_s[s]`; then `tail_s`. The
    recomputation of a stage's last unit may run before the gradient arrives, the others
    after it (as the programs place them). Everything else (copies, syncs, updates, shared
    links and cores, action overheads outside compute) only adds time."""
    m, pp = n_micro, len(estimates)
    orders = stage_orders(pp, m, weight_grad)
    f_end = [[0.0] * m for _ in range(pp)]
    b_end = [[0.0] * m for _ in range(pp)]  # the backward's, or its input half's
    done_f = [0] * pp  # forwards finished per stage (in micro-batch order)
    done_b = [0] * pp
    walker = list(lead_s)  # when each stage's walker is next free
    step = [0] * pp  # position in the stage's order
    pending = list(range(pp))
    while pending:
        s = pending.pop()
        e, order = estimates[s], orders[s]
        while step[s] < len(order):
            op, i = order[step[s]]
            if op is Op.FORWARD:
                if s > 0 and done_f[s - 1] <= i:
                    break  # waits for the previous stage's forward of i
                ready = f_end[s - 1][i] + hop_s[s - 1] if s > 0 else 0.0
                f_end[s][i] = walker[s] = max(walker[s], ready) + e.forward_s
                done_f[s] += 1
                if s + 1 < pp:
                    pending.append(s + 1)
            elif op is Op.BACKWARD_WEIGHT:
                walker[s] += e.weight_s  # after its BI, which this stage ran before
            else:
                if s + 1 < pp and done_b[s + 1] <= i:
                    break  # waits for the next stage's backward of i
                early = walker[s] + e.recompute_first_s
                ready = b_end[s + 1][i] + hop_s[s] if s + 1 < pp else 0.0
                own = e.backward_s - (e.weight_s if op is Op.BACKWARD_INPUT else 0.0)
                b_end[s][i] = walker[s] = (max(early, ready) + own
                                           + e.recompute_s - e.recompute_first_s)
                done_b[s] += 1
                if s > 0:
                    pending.append(s - 1)
            step[s] += 1
    return walker[0] + tail_s


def pipeline_bound(work_per_micro: float, n_micro: int, pp: int,
                   busy_per_micro: float | None = None, own_micro: float | None = None) -> float:
    """The least `lower_bound` any partition of `work_per_micro` seconds (forward + backward of
    one micro-batch through the whole model) into `pp` stages can have: the stages' bounds
    s_0 + ... + s_{k-1} + c s_k are all equal when s_k shrinks geometrically by (1 - 1/c),
    c = m. Split backwards: `work_per_micro` is the forward and the input halves (what the
    first bound of `lower_bound` chains), `busy_per_micro` all of it with the weight halves;
    the busiest stage does at least the average of that. Where a stage runs all but K of its
    BWs before its last BI (a capped bubble), its own term holds those too: with each stage's
    BWs at least rho times its chained work, c = `own_micro` = m + (m - K) rho."""
    c = own_micro or n_micro
    chained = work_per_micro / (1.0 - (1.0 - 1.0 / c) ** pp)
    if busy_per_micro is None:
        return chained
    return max(chained, busy_per_micro * n_micro / pp)
