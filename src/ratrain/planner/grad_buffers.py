"""Full-size gradient buffers alive at a stage's peak, for the planner's closed-form memory
estimate (planner/stage_cost.py).

Where a gradient lives less than the step (`Lifecycle.grad_lifetime`: "micro-batch" or
"transient"; schedule/plan.PipelinePlan.grad_lifetime) a backward makes a unit's full-size fp32
gradient, and the unit's sync frees it. A sync's wait follows the stage's next compute action
(schedule/grad_passes.py, add_early_sync_waits), so a buffer lives from a backward until one more
compute action has run. How many are alive at once, net of the activations the backwards have
freed by then, depends on the schedule: that walk is this module.
"""

from __future__ import annotations

from ratrain.planner.unit_table import UnitTable


def alive_at_peak(t: UnitTable, a: int, b: int, stage: int, pp: int,
                  recomputed: frozenset[int] = frozenset(),
                  recovering: float = 0.0) -> tuple[float, float]:
    """Bytes of full-size gradients alive at the peak of units [a, b) as stage `stage` of `pp`,
    net of the activations freed by then, beyond the rest of the estimate's sum: (with the most
    micro-batches in flight, with one fewer). `recomputed`: the stage's recomputed units;
    `recovering`: what the estimate adds for a recomputation's activations.

    Where each unit's backwards of the step are consecutive ("micro-batch": one buffer per
    backward; one micro-batch; BWs grouped per unit) a micro-batch's backward frees that
    micro-batch's activations unit by unit as the buffers appear (`_backward_walk`); after its
    last unit's, a forward of the next micro-batch's, or in the cool-down the next
    micro-batch's first backward, runs while that buffer lives (one micro-batch fewer in
    flight). BWs grouped per unit run in an order of their own: any two buffers, net of what
    their BWs freed.

    "transient" with more micro-batches keeps each unit's from its first backward to its last:
    under 1F1B and ZB-H1 in the bubble every unit's, once the first micro-batch's backward is
    through. Where no forward follows that (stage s holds all its micro-batches: m <= p - s,
    1F1B), the peak is either in that first backward, the buffers of the units it has gone
    through alive and their kept activations freed (`_first_backward`), or after it, with one
    micro-batch fewer and every buffer."""
    if not t.total("full", a, b):
        return 0.0, 0.0
    full, m = t.full, t.n_micro
    if t.lifecycle.grad_lifetime == "transient" and m > 1 and t.weight_grad != "grouped":
        every = t.total("full", a, b)
        if t.weight_grad is None and t.in_flight(stage, pp) == m:
            return _first_backward(t, a, b, recomputed, recovering), every
        return every, every
    kept = [0 if u in recomputed else t.saved[u] for u in range(a, b)]
    if t.weight_grad == "grouped":
        # a unit's buffer appears at its first BW, which frees that micro-batch's kept
        # activations of the unit; a second is alive only once the other unit's group is
        # through, every micro-batch's freed
        most = min(sum(sorted(full[a:b])[-2:]),
                   max(0.0, *(f - k for f, k in zip(full[a:b], kept)))
                   + max(0.0, *(f - m * k for f, k in zip(full[a:b], kept))))
        return most, most
    split = t.weight_grad is not None
    most = _backward_walk(t, a, b, recomputed, recovering, split)
    fewer = 0.0
    if m > 1:  # the first unit's buffer, during the next forward or cool-down backward
        fewer = full[a] + t.saved[a] + t.out[a]
        if b - a > 1 and (split or b - 1 not in recomputed):
            fewer = max(fewer, full[a] + full[b - 1] - kept[-1])
    return most, fewer


def _backward_walk(t: UnitTable, a: int, b: int, recomputed: frozenset[int], recovering: float,
                   split: bool) -> float:
    """One micro-batch's backward through units b - 1 down to a, each buffer freed after the
    next compute action: after unit u's backward (split: its BW), its buffer and unit u + 1's
    are alive where nothing ran between them (a whole backward's recomputation R of u does),
    and the kept activations of units u..b-1 freed; at R of u, unit u + 1's and the recomputed
    activations (where the estimate did not add them, counting on a kept unit's freed ones).
    The most, net."""
    most = freed = before = 0.0  # before: the buffer of the unit backwarded just before
    for u in range(b - 1, a - 1, -1):
        if u in recomputed and not split:
            most = max(most, before - freed + (0.0 if recovering else t.block_saved))
            before = 0.0  # waited right after R
        if u not in recomputed:
            freed += t.saved[u]
        most = max(most, before + t.full[u] - freed)
        before = t.full[u]
    return most


def _first_backward(t: UnitTable, a: int, b: int, recomputed: frozenset[int],
                    recovering: float) -> float:
    """"transient", the stage's first micro-batch's backward (units b - 1 down to a) with every
    micro-batch in flight: after unit u's backward the buffers of units u..b-1 are alive and the
    saved activations of the kept ones freed; at u's recomputation (R) those of u + 1..b-1, and
    the recomputed activations (where the estimate did not add them, counting on a kept unit's
    freed ones)."""
    alive = freed = most = 0.0
    for u in range(b - 1, a - 1, -1):
        if u in recomputed and not recovering:
            most = max(most, alive - freed + t.block_saved)
        alive += t.full[u]
        if u not in recomputed:
            freed += t.saved[u]
        most = max(most, alive - freed)
    return most
