"""Dynamic loss scaling: halve and skip on a non-finite norm, double after a run of clean steps,
and survive a checkpoint."""

import math

from ratrain.runtime.loss_scale import DynamicLossScale


def test_overflow_skips_and_halves_clean_steps_grow():
    scale = DynamicLossScale(scale=1024.0, growth_interval=3)
    assert scale.update(1.5) is False and scale.scale == 1024.0
    assert scale.update(math.inf) is True and scale.scale == 512.0
    assert scale.update(math.nan) is True and scale.scale == 256.0
    assert [scale.update(0.1) for _ in range(2)] == [False, False] and scale.scale == 256.0
    assert scale.update(0.1) is False and scale.scale == 512.0  # the third clean step in a row
    assert scale.skipped_steps == 2


def test_state_round_trips():
    scale = DynamicLossScale(growth_interval=5)
    scale.update(math.inf)
    scale.update(1.0)
    restored = DynamicLossScale()
    restored.load_state_dict(scale.state_dict())
    assert restored == scale
