"""Unit times at a micro-batch shape the profile did not measure, set by the ones it did.

A profile prices a shape it did not measure by FLOPs at the compute rate it fitted on the shape
it did. But a micro-batch's tokens change the rate: on the 2-core Xeon VM one `small` block's
forward and backward cost 230 us a token at 128 tokens a micro-batch, 192 at 512 and 165-176
at 1024 (docs/benchmarks.md, "The planner's threads, and what small micro-batches cost").
Where the profile measured the simulated model at two or more token counts (`ratrain profile`
measures its shape and one of about a quarter of its tokens), each unit kind's time is a fixed
part a call plus a part in proportion to its priced time, the line through the two measured
shapes nearest in tokens (between them, or the last two beyond them). Where that line says
nothing physical (a part below zero: measurements too noisy to tell), the measured / priced
ratio instead, interpolated in log tokens and held beyond the measured shapes. A profile of
a model of another shape (ModelShape: its name and depth aside), or of one micro-batch shape,
prices as before: a fixed cost a call fitted on one model does not carry to another (`tiny`'s
is per-op overhead, `small`'s its small matrix products).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable

from ratrain.sim.profile import MeasuredShape
from ratrain.sim.unit_costs import UnitShape

KINDS = ("embedding", "block", "head")


def shape_scale(measured: list[MeasuredShape], shape: UnitShape,
                priced: Callable[[UnitShape, str], float]) -> dict[str, float]:
    """Per unit kind, what its priced forward + backward on `shape` is multiplied by;
    `priced`(shape, kind): that sum at the profile's rates. Empty where the profile measured
    the shape's model (one of its shape) in its dtype at fewer than two token counts."""
    points: dict[int, MeasuredShape] = {}
    for m in measured:
        if m.dtype == shape.dtype and m.is_of(shape.model):
            points.setdefault(m.micro_batch_size * m.seq_len, m)
    if len(points) < 2:
        return {}
    at = sorted(points)
    i = min(max(bisect.bisect_left(at, shape.tokens), 1), len(at) - 1)
    scale = {}
    for kind in KINDS:
        (p_lo, m_lo), (p_hi, m_hi) = (_point(points[t], shape, kind, priced) for t in at[i - 1:i + 1])
        slope = (m_hi - m_lo) / (p_hi - p_lo)
        fixed = m_lo - slope * p_lo
        if slope > 0 and fixed >= 0:
            p = priced(shape, kind)
            scale[kind] = (fixed + slope * p) / p
        else:
            ratios = [m / p for p, m in (_point(points[t], shape, kind, priced) for t in at)]
            scale[kind] = _interpolate([math.log(t) for t in at], ratios, math.log(shape.tokens))
    return scale


def _point(m: MeasuredShape, shape: UnitShape, kind: str,
           priced: Callable[[UnitShape, str], float]) -> tuple[float, float]:
    """(priced, measured) forward + backward of a kind on a measured shape."""
    times = getattr(m, kind)
    at = UnitShape(shape.model, m.micro_batch_size, m.seq_len, shape.dtype)
    return priced(at, kind), times.forward_s + times.backward_s


def _interpolate(x: list[float], y: list[float], at: float) -> float:
    """Piecewise linear through (x, y), x ascending; the end values beyond them."""
    if at <= x[0]:
        return y[0]
    if at >= x[-1]:
        return y[-1]
    i = bisect.bisect_right(x, at)
    w = (at - x[i - 1]) / (x[i] - x[i - 1])
    return y[i - 1] + w * (y[i] - y[i - 1])
