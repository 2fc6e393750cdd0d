"""What the simulator takes from a profile: measured unit times only for a model of their shape,
an efficiency only where one was measured, medians that are medians, a forward without grad no
slower than with, and no number that is not finite or not in its range."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.plain_data import number
from ratrain.profiling import fits
from ratrain.profiling import measure as profiling
from ratrain.schedule.plan import build_plan
from ratrain.sim.links import Link
from ratrain.sim.profile import (PRESET_DIR, ComputeRate, MeasuredShape, ModelShape, UnitTimes,
                                 from_dict, load_profile, presets)
from ratrain.sim.profile_repeats import combine
from ratrain.sim.simulator import simulate

from .cli_runner import run_cli

TINY, SMALL = get_preset("tiny"), get_preset("small")


def _measured(model_shape: ModelShape | None = None, name: str = "tiny") -> MeasuredShape:
    times = UnitTimes(1e-3, 2e-3)
    return MeasuredShape(name, 256, 2, "float32", times, times, times, 9e-4,
                         model_shape=model_shape)


def _step(model, profile) -> float:
    return simulate(build_plan(model.n_layers, 2, 1, 4), model, profile,
                    micro_batch_size=2, seq_len=256).step_time


# --- unit times are of a model's shape -----------------------------------------------------------


def test_measured_unit_times_price_a_model_of_their_shape_whatever_its_name():
    bare = load_profile("cpu-local")
    measured = dataclasses.replace(bare, measured=[_measured(ModelShape.of(TINY))])
    # small's dimensions under tiny's name: priced as unmeasured, not at tiny's block times
    # (2026-12-02: 1.14 s predicted, 3.87 s as `--model small`, 5.66 s measured)
    named_tiny = dataclasses.replace(SMALL, name="tiny")
    assert measured.measured_for(named_tiny, 256, 2, "float32") is None
    assert _step(named_tiny, measured) == _step(named_tiny, bare)
    # tiny's shape by another name and depth: tiny's times (a block's time is its own)
    renamed = dataclasses.replace(TINY, name="custom", n_layers=6)
    assert measured.measured_for(renamed, 256, 2, "float32") is measured.measured[0]
    assert _step(renamed, measured) != _step(renamed, bare)
    # any field of the shape tells them apart
    for field, value in (("n_kv_heads", 2), ("vocab_size", 1024), ("position", "alibi"),
                         ("qkv_bias", True)):
        other = dataclasses.replace(TINY, **{field: value})
        assert measured.measured_for(other, 256, 2, "float32") is None, field


def test_a_profile_without_the_shape_is_of_the_preset_it_names():
    """Profiles written before the shape was kept measured presets only: the name says it."""
    old = dataclasses.replace(load_profile("cpu-local"), measured=[_measured()])
    assert old.measured_for(TINY, 256, 2, "float32") is old.measured[0]
    assert old.measured_for(dataclasses.replace(SMALL, name="tiny"), 256, 2, "float32") is None
    unknown = dataclasses.replace(old, measured=[_measured(name="custom")])
    assert unknown.measured_for(dataclasses.replace(TINY, name="custom"), 256, 2,
                                "float32") is None


def test_the_profile_keeps_the_measured_models_shape_in_its_file():
    cfg = profiling.profile_config("small", 256, 2, "float32")
    alone = {kind: [1e-3, 2e-3] for kind in ("embedding", "block", "head")}
    shape = fits.measured_shape(cfg, "small", [{"units": {"block_forward_no_grad": 5e-4}}],
                                alone, 0.0, {})
    assert shape.model_shape == ModelShape.of(SMALL)
    profile = dataclasses.replace(load_profile("cpu-local"), measured=[shape])
    again = from_dict(yaml.safe_load(yaml.safe_dump(profile.to_dict())))
    assert again.measured[0].model_shape == ModelShape.of(SMALL)
    assert again.measured_for(dataclasses.replace(SMALL, name="mine"), 256, 2, "float32")


# --- an efficiency only where measured -----------------------------------------------------------


def _bf16_rates() -> dict[str, ComputeRate]:
    cfg = profiling.profile_config("tiny", 256, 2, "bfloat16")
    per_rank = [{"matmul_s": {"bfloat16": 2 * 1024**3 / 370e9, "float32": 2 * 1024**3 / 110e9}}]
    return fits.compute_rates(cfg, "cpu", per_rank, UnitTimes(0.019, 0.035), 0.0)


def test_a_dtype_whose_efficiency_was_not_measured_is_refused_by_name(
        monkeypatch, capsys, tmp_path):
    rates = _bf16_rates()
    assert rates["float32"].peak_flops == pytest.approx(110e9)
    assert rates["float32"].efficiency is None and rates["bfloat16"].efficiency > 0
    profile = load_profile("cpu-local")
    profile.device.compute = rates
    assert profile.rate("bfloat16").efficiency == rates["bfloat16"].efficiency
    with pytest.raises(UserError, match=r"`ratrain profile --dtype float32`"):
        profile.rate("float32")
    # as written, read back and merged over repeats; simulate says so in one line
    path = tmp_path / "bf16.yaml"
    combine([profile, profile], [4096.0]).save(path)
    assert load_profile(str(path)).device.compute["float32"].efficiency is None
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--model", "tiny", "--profile",
                           str(path), "--dtype", "float32", "--global-batch", "8")
    assert code == 2 and "ratrain profile --dtype float32" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", presets())
def test_every_presets_every_dtype_still_has_its_rate(name):
    profile = load_profile(name)
    for dtype in profile.device.compute:
        assert profile.rate(dtype).achieved > 0


# --- medians -------------------------------------------------------------------------------------


def _repeat(backward: float, bandwidth: float, link: Link):
    profile = load_profile("cpu-local")
    profile.measured = [_measured(ModelShape.of(TINY))]
    profile.measured[0].block = UnitTimes(1e-3, backward)
    profile.device.memory_bandwidth = bandwidth
    profile.intra_node.p2p = link
    return profile


def test_two_repeats_merge_into_their_mean_not_one_of_them():
    sizes = [4096.0, 1 << 20]
    slow_link, fast_link = Link(1e9, 200e-6), Link(2e9, 100e-6)
    combined = combine([_repeat(3e-3, 8e9, slow_link), _repeat(2e-3, 10e9, fast_link)], sizes)
    assert combined.measured[0].block.backward_s == pytest.approx(2.5e-3)
    assert combined.device.memory_bandwidth == pytest.approx(9e9)
    # a link stays one line: its time at every size the mean of the two repeats'
    for n in (*sizes, 1e9):
        assert combined.intra_node.p2p.time(n) == pytest.approx(
            (slow_link.time(n) + fast_link.time(n)) / 2)
    # a count stays whole
    assert combined.device.cores == 2 and isinstance(combined.measured[0].seq_len, int)
    # an odd count: the middle repeat's, a link as that repeat fitted it
    three = combine([_repeat(3e-3, 8e9, slow_link), _repeat(2e-3, 10e9, fast_link),
                     _repeat(2.2e-3, 9.5e9, Link(1.5e9, 150e-6))], sizes)
    assert three.measured[0].block.backward_s == 2.2e-3
    assert three.intra_node.p2p == Link(1.5e9, 150e-6)


# --- a forward without grad -----------------------------------------------------------------------


def _no_grad(pipeline_s: float, contention: float) -> tuple[MeasuredShape, dict[str, str]]:
    cfg = profiling.profile_config("tiny", 256, 2, "float32")
    alone = {"embedding": [3e-4, 4e-4], "block": [11.5e-3, 20.3e-3], "head": [2.4e-3, 4e-3]}
    notes: dict[str, str] = {}
    shape = fits.measured_shape(cfg, "tiny", [{"units": {"block_forward_no_grad": pipeline_s}}],
                                alone, contention, notes)
    return shape, notes


def test_a_forward_without_grad_is_no_slower_than_with_it_and_the_notes_say_when_bounded():
    shape, notes = _no_grad(19.9e-3, 0.0)  # prof2.yaml of 2026-12-02
    assert shape.block_forward_no_grad_s == shape.block.forward_s == 11.5e-3
    assert "19.9 ms" in notes[fits.NO_GRAD] and "bounded" in notes[fits.NO_GRAD]
    shape, notes = _no_grad(9.6e-3, 0.2)
    assert shape.block_forward_no_grad_s == pytest.approx(8e-3) and not notes
    # merged over repeats, a note of some says in how many
    profile = load_profile("cpu-local")
    bounded = dataclasses.replace(profile, notes={fits.NO_GRAD: "bounded"})
    combined = combine([bounded, profile], [4096.0])
    assert combined.notes[fits.NO_GRAD] == "in 1 of 2 repeats: bounded"


# --- finite, in range ----------------------------------------------------------------------------


def _with(tmp_path, dotted: str, value) -> str:
    data = yaml.safe_load((PRESET_DIR / "cpu-local.yaml").read_text())
    data["measured"] = [dataclasses.asdict(_measured(ModelShape.of(TINY)))]
    node = data
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("dotted,value,needle", [
    ("device.action_overhead_s", math.nan, "device.action_overhead_s: expected a finite number"),
    ("measured.0.block.forward_s", math.nan, "measured[0].block.forward_s: expected a finite"),
    ("device.memory_bandwidth", math.inf, "device.memory_bandwidth: expected a finite number"),
    ("devices_per_node", math.inf, "devices_per_node: expected a finite number, got inf"),
    ("device.cores", -math.inf, "device.cores: expected a finite number"),
    ("device.compute.float32.efficiency", "nan", "efficiency: expected a finite number"),
    ("device.thread_efficiency", 5.0, "device.thread_efficiency: must be at most 1, got 5.0"),
    ("device.compute.float32.efficiency", 50.0, "float32.efficiency: must be at most 2, got 50.0"),
    ("device.compute.float32.attention_efficiency", 3.0, "attention_efficiency: must be at most 2"),
])
def test_numbers_that_are_not_finite_or_not_in_range_are_refused_by_path(
        tmp_path, dotted, value, needle):
    path = _with(tmp_path, dotted, value)
    with pytest.raises(UserError) as e:
        load_profile(path)
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1


def test_the_edges_of_the_ranges_load(tmp_path):
    for dotted, value in (("device.thread_efficiency", 0.0), ("device.thread_efficiency", 1.0),
                          ("device.compute.float32.efficiency", 1.12)):  # the VM's, measured
        loaded = load_profile(_with(tmp_path, dotted, value)).to_dict()
        for key in dotted.split("."):
            loaded = loaded[key]
        assert loaded == value


def test_the_shared_number_check_refuses_what_is_not_finite():
    for value in (math.nan, math.inf, "-inf", "nan"):
        with pytest.raises(ValueError, match="finite"):
            number(value, whole=value == math.inf)
    assert number(10**30, whole=True) == 10**30


STORED = Path(__file__).parents[2] / "bench" / "results"


@pytest.mark.parametrize("path", sorted(STORED.rglob("*.yaml")), ids=str)
def test_every_stored_profile_still_loads(path):
    if "device" in (yaml.safe_load(path.read_text()) or {}):
        assert load_profile(path).device.memory_bandwidth > 0
