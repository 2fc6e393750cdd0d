"""sim/shape_scale.py: a profile that measured its model at two token counts prices the
shapes between and beyond them by what it measured, not by one rate."""

from __future__ import annotations

import dataclasses

import pytest

from ratrain.models.presets import get_preset
from ratrain.profiling.measure import profile_config, smaller_config
from ratrain.schedule.plan import build_plan
from ratrain.sim.profile import MeasuredShape, UnitTimes, load_profile
from ratrain.sim.shape_scale import KINDS
from ratrain.sim.simulator import simulate

MODEL = get_preset("tiny")


def _priced(profile, seq: int, micro: int) -> dict[str, tuple[float, float]]:
    """Each kind's (forward, backward) as the profile prices it where it measured nothing."""
    from ratrain.sim.cost_model import StageCosts
    from ratrain.sim.placement import stage_setups

    plan = build_plan(MODEL.n_layers, 1, 1, 1)
    setup = stage_setups(plan, MODEL, profile, micro_batch_size=micro, seq_len=seq,
                         dtype="float32")[0]
    costs = StageCosts(setup)
    units = {"embedding": 0, "block": 1, "head": MODEL.n_layers + 1}
    return {kind: (costs.forward(u), sum(costs._backward_parts(u))) for kind, u in units.items()}


def _measured(profile, seq: int, micro: int, slower: float) -> MeasuredShape:
    """What the shape measured: `slower` times its priced units."""
    priced = _priced(profile, seq, micro)
    return MeasuredShape("tiny", seq, micro, "float32",
                         **{k: UnitTimes(f * slower, b * slower) for k, (f, b) in priced.items()})


def _step(profile, seq: int, micro: int) -> float:
    return simulate(build_plan(MODEL.n_layers, 2, 1, 4), MODEL, profile,
                    micro_batch_size=micro, seq_len=seq).step_time


def _profiles(small_slower: float):
    """cpu-local with nothing measured, with tiny measured at 512 tokens as priced, and with
    128 tokens measured `small_slower` times their priced time beside it."""
    bare = load_profile("cpu-local")
    one = dataclasses.replace(bare, measured=[_measured(bare, 256, 2, 1.0)])
    two = dataclasses.replace(bare, measured=[*one.measured,
                                              _measured(bare, 128, 1, small_slower)])
    return bare, one, two


@pytest.fixture
def profiles():
    return _profiles(1.3)


def _scaled(profile, bare, seq: int, micro: int) -> dict[str, float]:
    """Each kind's forward + backward on the profile over its priced time (forward and
    backward scaled alike)."""
    on, priced = _priced(profile, seq, micro), _priced(bare, seq, micro)
    for k in on:
        assert on[k][0] / priced[k][0] == pytest.approx(on[k][1] / priced[k][1], rel=1e-9)
    return {k: sum(on[k]) / sum(priced[k]) for k in on}


def test_a_fixed_part_a_call_and_one_in_proportion_through_the_measured_shapes(profiles):
    bare, one, two = profiles
    small, large = ({k: sum(v) for k, v in _priced(bare, s, m).items()} for s, m in ((128, 1),
                                                                                   (256, 2)))
    for seq, micro in ((64, 1), (128, 2), (256, 1), (256, 4), (512, 4)):
        priced = {k: sum(v) for k, v in _priced(bare, seq, micro).items()}
        for kind, scale in _scaled(two, bare, seq, micro).items():
            slope = (large[kind] - 1.3 * small[kind]) / (large[kind] - small[kind])
            fixed = 1.3 * small[kind] - slope * small[kind]
            assert 0 < slope < 1 and fixed > 0
            assert scale == pytest.approx((fixed + slope * priced[kind]) / priced[kind], rel=1e-9)
    # the measured shapes themselves: their own times; between them dearer a token than the
    # large, cheaper than the small; past the large, cheaper still; below the small, dearer
    assert list(_scaled(two, bare, 128, 1).values()) == pytest.approx([1.3] * 3)
    assert all(1.0 < x < 1.3 for x in _scaled(two, bare, 128, 2).values())
    assert all(x < 1.0 for x in _scaled(two, bare, 512, 4).values())
    assert all(x > 1.3 for x in _scaled(two, bare, 64, 1).values())
    assert _step(bare, 128, 1) < _step(two, 128, 1) < 1.3 * _step(bare, 128, 1)


def test_where_the_small_shape_ran_cheaper_a_token_the_ratio_is_interpolated():
    """No fixed part below zero: measured / priced, in log tokens, held beyond the shapes."""
    bare, _, two = _profiles(0.9)
    # 256 tokens, halfway in log tokens from 128 (0.9x) to 512 (1x), whichever the shape
    for seq, micro in ((128, 2), (256, 1)):
        assert list(_scaled(two, bare, seq, micro).values()) == pytest.approx([0.95] * 3)
    assert list(_scaled(two, bare, 64, 1).values()) == pytest.approx([0.9] * 3)
    assert list(_scaled(two, bare, 256, 4).values()) == pytest.approx([1.0] * 3)


def test_one_measured_shape_or_a_model_of_another_shape_prices_as_before(profiles):
    bare, one, two = profiles
    for seq, micro in ((64, 1), (128, 2), (256, 4)):
        assert _step(one, seq, micro) == _step(bare, seq, micro)
        assert set(_scaled(one, bare, seq, micro).values()) == {1.0}
    # what was measured is of a model's shape, not of its name: a wider tiny prices as before,
    # tiny's shape by another name and depth through tiny's measurements
    wider = dataclasses.replace(MODEL, ffn_dim=2 * MODEL.ffn_dim)
    renamed = dataclasses.replace(MODEL, name="tiny-other", n_layers=6)
    for model, as_before in ((wider, True), (renamed, False)):
        plan = build_plan(model.n_layers, 2, 1, 4)
        steps = [simulate(plan, model, p, micro_batch_size=1, seq_len=64).step_time
                 for p in (two, bare)]
        assert (steps[0] == steps[1]) == as_before, model.name
    assert set(KINDS) == {"embedding", "block", "head"}


@pytest.mark.parametrize("seq, micro, smaller", [
    (256, 2, (128, 1)), (256, 8, (256, 2)), (1024, 1, (256, 1)), (64, 1, (16, 1)),
    (32, 1, None),
])
def test_the_profile_measures_a_quarter_of_its_tokens_beside_its_shape(seq, micro, smaller):
    cfg = smaller_config(profile_config("tiny", seq, micro, "float32"))
    if smaller is None:
        assert cfg is None
        return
    assert (cfg.train.seq_len, cfg.train.micro_batch_size) == smaller
    assert cfg.train.global_batch % cfg.train.micro_batch_size == 0
