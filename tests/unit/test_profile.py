"""Hardware profiles: the presets load, the loader refuses broken files with the path of what is
wrong (and nothing but a UserError escapes it), and `ratrain profile` measures this machine into
a file the loader reads back."""

from __future__ import annotations

import copy
import functools
import json
import random

import pytest
import yaml

from ratrain.host_cores import usable_cores
from ratrain.models.presets import get_preset
from ratrain.profiling import fits
from ratrain.profiling import measure as profiling
from ratrain.profiling.ranks import Counts
from ratrain.profiling.table import summary_rows
from ratrain.errors import UserError
from ratrain.sim.profile import (PRESET_DIR, ComputeRate, HardwareProfile, Link, MeasuredShape,
                                 UnitTimes, from_dict, load_profile, presets)
from ratrain.sim.profile_repeats import at_edge, combine, spread, unstable

from .cli_runner import run_cli


def _numbers(data, path=""):
    """(path, value) of every number in plain YAML data."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield path, data


def _preset_data(name: str) -> dict:
    return yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())


# --- presets -------------------------------------------------------------------------------------


def test_there_are_presets():
    assert {"cpu-local", "mt3000", "a100-40g-10gbe", "h100-80g-ib"} <= set(presets())


@pytest.mark.parametrize("name", presets())
def test_every_preset_loads_with_positive_figures(name):
    profile = load_profile(name)
    assert isinstance(profile, HardwareProfile)
    assert [p for p, v in _numbers(_preset_data(name)) if v <= 0] == []
    d = profile.device
    assert d.memory_bytes > 0 and d.memory_bandwidth > 0 and d.compute
    assert all(r.peak_flops > 0 and 0 < r.efficiency <= 1 for r in d.compute.values())
    for links in (profile.intra_node, profile.inter_node):
        assert links.p2p.bandwidth > 0 and links.collective.bandwidth > 0


def test_mt3000_has_the_papers_20_gb():
    assert load_profile("mt3000").device.memory_bytes == 20e9


# --- load_profile's errors -----------------------------------------------------------------------


def _write(tmp_path, data) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _set(data: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    data[last] = value


@pytest.mark.parametrize("edit,needle", [
    (lambda d: _set(d, "device.speed", 1), "device.speed: unknown key"),
    (lambda d: _set(d, "device.memory_bytes", "lots"),
     "device.memory_bytes: expected a number, got 'lots'"),
    (lambda d: _set(d, "intra_node.p2p.bandwidth", -1e9), "intra_node.p2p.bandwidth: must be"),
    (lambda d: d["device"].pop("name"), "device.name: missing"),
    (lambda d: _set(d, "devices_per_node", [4]), "devices_per_node: expected a number"),
])
def test_broken_profiles_are_refused_with_the_path(tmp_path, edit, needle):
    data = _preset_data("cpu-local")
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(UserError) as e:
        load_profile(path)
    assert needle in str(e.value) and path in str(e.value)


def test_a_file_that_is_not_yaml_is_refused(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("device: [unclosed\n  name: {")
    with pytest.raises(UserError, match="cannot parse profile") as e:
        load_profile(str(path))
    assert str(path) in str(e.value)


def test_an_unknown_profile_name_is_refused():
    with pytest.raises(UserError, match="no hardware profile 'nowhere'"):
        load_profile("nowhere")


def _paths(data, prefix=()):
    """Every key path into nested dicts and lists."""
    if isinstance(data, dict):
        items = data.items()
    else:
        items = enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _mutate(data: dict, rng: random.Random) -> dict:
    """One random damage: a key deleted, or a value replaced by a string, a list or a negative
    number."""
    data = copy.deepcopy(data)
    *parents, last = rng.choice(list(_paths(data)))
    holder = data
    for key in parents:
        holder = holder[key]
    how = rng.choice(["delete", "string", "list", "negative"])
    if how == "delete":
        del holder[last]
    else:
        text = "".join(rng.choice("abc019.e-") for _ in range(rng.randint(0, 6)))
        holder[last] = {"string": text, "list": [rng.random()] * rng.randint(0, 2),
                        "negative": -rng.random() * 10 ** rng.randint(0, 12)}[how]
    return data


def test_random_damage_loads_or_raises_a_user_error(tmp_path):
    rng = random.Random(0)
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(60):
        data = _mutate(_preset_data(rng.choice(presets())), rng)
        path = tmp_path / f"p{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        try:
            load_profile(str(path))
            outcomes["loaded"] += 1
        except UserError as e:
            assert str(path) in str(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 30  # most damage must be noticed


# --- ratrain profile -----------------------------------------------------------------------------


def test_fit_link_recovers_latency_and_bandwidth():
    sizes = profiling.LINK_SIZES
    latency, bandwidth = fits.fit_link(sizes, [50e-6 + s / 2e9 for s in sizes])
    assert latency == pytest.approx(50e-6, rel=1e-6) and bandwidth == pytest.approx(2e9, rel=1e-6)


def test_process_overhead_is_the_line_through_two_stages():
    mib = 2**20
    fixed, per_byte = fits.fit_process_overhead([(70 * mib, 54 * mib), (25 * mib, 44 * mib)])
    assert per_byte == pytest.approx(10 / 45) and fixed == pytest.approx(44 * mib - 25 * mib * 10 / 45)
    # the larger stage grew no more beyond its ledger: a fixed overhead, the larger of the two
    assert fits.fit_process_overhead([(25.0, 50.0), (70.0, 40.0)]) == (50.0, 0.0)


def test_contention_is_the_median_slowdown_over_alone():
    alone = {"embedding": [1.0, 2.0], "block": [10.0, 20.0], "head": [3.0, 6.0]}
    ranks = [{"units": {"embedding": [1.1, 2.2], "block": [12.0, 24.0]}},
             {"units": {"block": [12.0, 24.0], "head": [3.0, 6.0]}}]
    # forward and backward: block 1.2 (both ranks), embedding 1.1, head 1.0; the median is 1.1
    assert fits.contention_of(ranks, alone) == pytest.approx(0.1)
    assert fits.contention_of(ranks, {k: [2 * t for t in v] for k, v in alone.items()}) == 0.0


@pytest.mark.parametrize("args,needle", [
    (["--model", "no-such-model"], "unknown model preset 'no-such-model'"),
    (["--seq-len", "4096"], "exceeds the model's max_seq_len 1024"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1"),
    (["--ranks", "0"], "--ranks must be >= 1"),
    (["--ranks", "5"], "--ranks 5: at most 4"),  # (it measured, then failed in a rank)
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_profile_mistakes_exit_2_with_one_line(monkeypatch, capsys, tmp_path, args, needle):
    out = tmp_path / "p.yaml"
    code, _, err = run_cli(monkeypatch, capsys, "profile", "--out", str(out), *args)
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


# What a profile holds, not how stable its figures are: each measurement taken a few times,
# the single process's stage 2 blocks (still a second stage beside the ranks' one-block ones)
FEW = Counts(warmup=1, repeats=5, step_warmup=1, step_repeats=2, link_warmup=1, link_repeats=3,
             alone_blocks=2)


@pytest.mark.dist
def test_profile_measures_this_machine(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(profiling, "measure", functools.partial(profiling.measure, counts=FEW))
    out = tmp_path / "sub" / "measured.yaml"
    code, stdout, err = run_cli(monkeypatch, capsys, "profile", "--model", "tiny",
                                "--seq-len", "64", "--micro-batch-size", "1", "--ranks", "2",
                                "--repeats", "2", "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}" in stdout and "block forward / backward" in stdout
    assert "measuring 2/2" in err
    profile = load_profile(str(out))
    # a repeat beside other work on the machine (the rest of a test run, on CI) is set aside
    # and said to be: the other is then the only one the profile holds
    set_aside = "set aside" in profile.notes.get("other_work", "")
    assert ("stability: measured once" if set_aside else "stability: 2 repeats") in stdout
    assert len(profile.measured) == 2  # the profiled shape, and a quarter of its tokens
    m, fewer = profile.measured_for(get_preset("tiny"), 64, 1, "float32"), profile.measured[1]
    assert m is not None and (fewer.seq_len, fewer.micro_batch_size) == (16, 1)
    assert "micro-batch 1 x 16" in stdout
    for times in (fewer.embedding, fewer.block, fewer.head):
        assert times.forward_s > 0 and times.backward_s > 0
    for times in (m.embedding, m.block, m.head):
        assert times.forward_s > 0 and times.backward_s > 0
    assert m.block.backward_s > m.block.forward_s
    if usable_cores() > 1:  # one process on every core against one thread
        assert 0.0 <= profile.device.thread_efficiency <= 1.0
        assert "each thread beyond one adds" in stdout
    assert m.block.backward_input_s > 0 and m.block.backward_weight_s > 0
    assert m.block_forward_no_grad_s > 0
    rate = profile.rate("float32")
    assert rate.peak_flops > 0 and 0 < rate.efficiency <= 1.5 and 0 < rate.attention_efficiency < 1.5
    for links in (profile.intra_node, profile.inter_node):
        assert links.p2p.bandwidth > 0 and links.collective.bandwidth > 0
    assert profile.device.memory_bandwidth > 0 and profile.device.action_overhead_s >= 0
    d = profile.device
    assert d.contention >= 0 and d.process_overhead_bytes >= 0 and d.process_overhead_per_byte >= 0
    assert d.process_overhead_bytes + d.process_overhead_per_byte > 0
    assert profile.notes["inter_node"] == profiling.INTER_NODE_NOTE


def _fake_profile() -> HardwareProfile:
    profile = load_profile("cpu-local")
    times = UnitTimes(1e-3, 2e-3)
    profile.measured = [MeasuredShape("tiny", 256, 2, "float32", times, times, times, 9e-4)]
    return profile


def test_profile_json_and_default_out(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    asked = {}

    def fake_measure(*args, **kwargs):
        asked["args"] = args
        return _fake_profile()

    monkeypatch.setattr(profiling, "measure", fake_measure)
    code, stdout, err = run_cli(monkeypatch, capsys, "profile", "--json")
    assert code == 0, err
    assert asked["args"] == ("tiny", 256, 2, "float32", None, 3)  # the defaults
    assert json.loads(stdout) == _fake_profile().to_dict()
    assert load_profile(str(profiling.default_out())).to_dict() == _fake_profile().to_dict()


# --- repeated measurements -----------------------------------------------------------------------


def _repeat(block_backward: float, contention: float, latency: float, bandwidth: float):
    profile = _fake_profile()
    profile.measured[0].block = UnitTimes(1e-3, block_backward)
    profile.device.contention = contention
    profile.intra_node.p2p = Link(bandwidth, latency)
    return profile


def test_repeats_combine_into_medians_and_name_what_did_not_repeat():
    sizes = [4096.0, 1 << 20]
    repeats = [_repeat(2.0e-3, 0.02, 100e-6, 2e9), _repeat(2.1e-3, 0.35, 140e-6, 2.2e9),
               _repeat(2.05e-3, 0.03, 120e-6, 2.1e9)]
    combined = combine(repeats, sizes)
    assert combined.measured[0].block.backward_s == 2.05e-3
    assert combined.intra_node.p2p == Link(2.1e9, 120e-6)  # one fit, not a mix of two
    # contention moved the slowdown by 32%: named, and its median used like every other
    # figure's (not 0, which biased every multi-process prediction fast); the block by 5%: kept
    note = combined.notes["stability"]
    assert combined.device.contention == 0.03
    assert ("device.contention spread 32% (0.02, 0.35, 0.03): the median is used; predictions "
            "that lean on it carry its spread") in note
    assert "not applied" not in note
    assert "block" not in note
    # the link predicts 4 KiB in 102-142 us (a 33% spread): named, its median fit used
    assert "intra_node.p2p spread" in note
    bad = unstable([r.to_dict() for r in repeats], sizes)
    assert set(bad) == {"device.contention", "intra_node.p2p"}


def test_figures_that_did_not_repeat_keep_their_slowest_and_fastest_repeat():
    """A prediction can say how far it leans on what did not repeat: the profile keeps each
    unstable figure at its slowest and fastest repeat, and at_edge puts them in place."""
    sizes = [4096.0, 1 << 20]
    repeats = [_repeat(2.0e-3, 0.02, 100e-6, 2e9), _repeat(2.6e-3, 0.35, 140e-6, 2.2e9),
               _repeat(2.05e-3, 0.03, 120e-6, 2.1e9)]
    for r, attention in zip(repeats, (15e9, 10e9, 12e9)):
        r.device.compute = {"float32": ComputeRate(50e9, 0.8, attention / 50e9)}
    combined = combine(repeats, sizes)
    slow, fast = combined.unstable["slow"], combined.unstable["fast"]
    assert set(slow) == set(fast) == {
        "measured[0].block.backward_s", "device.contention",
        "device.compute.float32.attention_efficiency",
        "intra_node.p2p.bandwidth", "intra_node.p2p.latency"}
    assert (slow["measured[0].block.backward_s"], fast["measured[0].block.backward_s"]) == (2.6e-3, 2.0e-3)
    assert (slow["device.contention"], fast["device.contention"]) == (0.35, 0.02)
    assert slow["device.compute.float32.attention_efficiency"] == pytest.approx(0.2)
    assert fast["device.compute.float32.attention_efficiency"] == pytest.approx(0.3)
    # a link's edges are its repeats' envelope: the least bandwidth with the most latency.
    # (They were the repeats whose times summed over the measured sizes were longest and
    # shortest: 140 us + 2.2 GB/s as "slow", the faster past ~83 MB.)
    assert (slow["intra_node.p2p.bandwidth"], slow["intra_node.p2p.latency"]) == (2e9, 140e-6)
    assert (fast["intra_node.p2p.bandwidth"], fast["intra_node.p2p.latency"]) == (2.2e9, 100e-6)
    at_slow, at_fast = at_edge(combined, "slow"), at_edge(combined, "fast")
    assert at_slow.measured[0].block.backward_s == 2.6e-3 and at_slow.device.contention == 0.35
    assert at_fast.measured[0].block.backward_s == 2.0e-3 and at_fast.unstable == {}
    assert combined.measured[0].block.backward_s == 2.05e-3  # the median stays the profile's
    # it survives the YAML a profile is written as, and a stable profile has none
    assert from_dict(yaml.safe_load(yaml.safe_dump(combined.to_dict()))).unstable == combined.unstable
    assert combine(repeats[:1] * 2, sizes).unstable == {}
    # a profile edited by hand whose unstable figures name one it no longer has: said so
    combined.unstable["slow"]["measured[1].block.forward_s"] = 1.0
    with pytest.raises(UserError, match=r"unstable.slow: 'measured\[1\].block.forward_s' is no figure"):
        at_edge(combined, "slow")


def test_a_links_edges_bracket_its_median_at_every_size_in_profiles_made_before_too():
    """The H200 profile of 2026-11-26 kept its host link's "slow" edge as the repeat of more
    latency and more bandwidth (58.4 GB/s against the median's 56.9): past a few MB it was the
    faster, and llama2-7b's plan at batch 16 was predicted at 11.29 s with a range of
    10.71-11.27 s. at_edge takes each link's edge with its median, so the range holds it."""
    from ratrain.sim.links import Link

    profile = load_profile("bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml")
    slow, fast = at_edge(profile, "slow"), at_edge(profile, "fast")
    for n in (4096.0, 64e6, 1e9):
        def time(p):
            return Link(p.device.host_link.bandwidth, p.device.host_link.latency).time(n)
        assert time(fast) <= time(profile) <= time(slow)


def _block_backward_unstable(tmp_path):
    """A profile file whose two repeats timed the block's backward 50% apart."""
    combined = combine([_repeat(2.0e-3, 0.0, 100e-6, 2e9), _repeat(3.0e-3, 0.0, 100e-6, 2e9)],
                       [4096.0, 1 << 20])
    path = tmp_path / "profile.yaml"
    combined.save(path)
    return path


def test_simulate_gives_the_range_the_unstable_figures_allow(monkeypatch, capsys, tmp_path):
    path = _block_backward_unstable(tmp_path)
    code, stdout, err = run_cli(monkeypatch, capsys, "simulate", "--model", "tiny",
                                "--profile", str(path), "--seq-len", "256",
                                "--micro-batch-size", "2", "--global-batch", "8", "--json")
    assert code == 0, err
    out = json.loads(stdout)
    fast, slow = out["step_time_range_s"]
    assert fast < slow and fast <= out["step_time_s"] <= slow
    assert out["unstable_figures"] == ["measured[0].block.backward_s"]


def test_plan_gives_its_best_plans_range(monkeypatch, capsys, tmp_path):
    path = _block_backward_unstable(tmp_path)
    args = ("plan", "--model", "tiny", "--profile", str(path), "--devices", "2", "--seq-len",
            "256", "--global-batch", "8", "--memory-budget", "4GB")
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    out = json.loads(stdout)
    best = out["plans"][0]
    fast, slow = best["step_time_range_s"]
    assert fast < slow and fast <= best["step_time_s"] <= slow
    assert out["unstable_figures"] == ["measured[0].block.backward_s"]
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert f"plan 1: {fast:.4g}-{slow:.4g} s with the profile's figures that did not" in stdout


def _contention_unstable(tmp_path):
    """A profile file whose three repeats measured contention as 2026-11-26's CPU profile did:
    0.188, 0.345, 0.183 (everything else alike)."""
    combined = combine([_repeat(2.0e-3, c, 100e-6, 2e9) for c in (0.188, 0.345, 0.183)],
                       [4096.0, 1 << 20])
    path = tmp_path / "profile.yaml"
    combined.save(path)
    return path


def test_an_unstable_contention_widens_the_range_and_does_not_bias_the_prediction(
        monkeypatch, capsys, tmp_path):
    """Two ranks on the profile's 2 cores: contention applies in full. The prediction is the
    median's (0.188), inside the range the contention's slowest and fastest repeats give, not
    the 0 that priced the step below the range's own fast edge."""
    path = _contention_unstable(tmp_path)
    assert load_profile(str(path)).device.contention == 0.188
    args = ("simulate", "--model", "tiny", "--profile", str(path), "--seq-len", "256",
            "--micro-batch-size", "2", "--global-batch", "8")
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--pp", "2", "--json")
    assert code == 0, err
    out = json.loads(stdout)
    fast, slow = out["step_time_range_s"]
    assert fast < out["step_time_s"] < slow
    assert out["unstable_figures"] == ["device.contention"]
    # the prediction at contention 0 (the old rule) lies below the range's fast edge
    zero = yaml.safe_load(path.read_text())
    zero["device"]["contention"] = 0.0
    zero_path = tmp_path / "zero.yaml"
    zero_path.write_text(yaml.safe_dump(zero))
    code, stdout, err = run_cli(monkeypatch, capsys, *args[:4], str(zero_path), *args[5:],
                                "--pp", "2", "--json")
    assert code == 0, err
    assert json.loads(stdout)["step_time_s"] < fast
    # one process: contention does not apply, nothing to widen
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--pp", "1", "--dp", "1", "--json")
    assert code == 0, err
    out = json.loads(stdout)
    fast, slow = out["step_time_range_s"]
    assert fast == pytest.approx(out["step_time_s"]) == pytest.approx(slow)


def test_repeats_that_agree_say_so():
    repeats = [_repeat(2.0e-3, 0.02, 100e-6, 2e9), _repeat(2.02e-3, 0.03, 101e-6, 2e9)]
    combined = combine(repeats, [4096.0])
    assert combined.device.contention == pytest.approx(0.025)  # two: their mean
    assert combined.notes["stability"] == "2 repeats: every figure within 10% of its median"
    assert spread([0.0, 0.0]) == 0.0 and spread([1.0, 2.0, 3.0]) == 1.0


def test_repeats_merge_a_compute_rate_into_its_median_achieved_rate():
    """Each repeat's efficiency is its block's rate over its own peak, so a slow peak comes
    with a high efficiency. The median efficiency times the median peak is the median-peak
    repeat's rate, not the median rate: 42.8 GFLOP/s where the median is 48.4 (the three
    repeats of 2026-11-23)."""
    repeats = []
    for peak, achieved in ((44.9e9, 50.3e9), (66.6e9, 42.8e9), (87.1e9, 48.4e9)):
        r = _repeat(2.0e-3, 0.02, 100e-6, 2e9)
        r.device.compute = {"float32": ComputeRate(peak, achieved / peak, 15e9 / peak)}
        repeats.append(r)
    combined = combine(repeats, [4096.0])
    rate = combined.device.compute["float32"]
    assert rate.peak_flops == 66.6e9
    assert rate.achieved == pytest.approx(48.4e9)
    assert rate.attention_achieved == pytest.approx(15e9)
    # judged as what each does to a prediction: the peak (MFU) and the achieved rate
    note = combined.notes["stability"]
    assert "device.compute.float32.peak_flops spread 63%" in note
    assert "device.compute.float32.achieved spread 15%" in note
    assert "efficiency" not in note


def test_repeats_beside_other_work_are_set_aside_or_named():
    sizes = [4096.0]
    quiet, busy = _repeat(2.0e-3, 0.02, 100e-6, 2e9), _repeat(3.0e-3, 0.6, 100e-6, 2e9)
    combined = combine([busy, quiet, quiet], sizes, other_work=[1.0, 0.1, 0.0])
    assert combined.measured[0].block.backward_s == 2.0e-3 and combined.device.contention == 0.02
    assert "the 1 repeat beside more than 0.25 cores of it is set aside" in combined.notes["other_work"]
    # one kept of two: said so (it read "measured once ... --repeats N" to a --repeats 2)
    assert combine([busy, quiet], sizes, other_work=[1.0, 0.0]).notes["stability"] == (
        "1 of 2 repeats kept (1 set aside beside other work): stability not checked; rerun on "
        "a quieter machine or with more --repeats")
    # nothing quiet: the times are what there is, and contention its median, with a range
    # from a quiet machine's 0 to its largest repeat though its repeats agree
    combined = combine([busy, busy], sizes, other_work=[1.0, 0.9])
    assert combined.measured[0].block.backward_s == 3.0e-3 and combined.device.contention == 0.6
    assert "contention cannot be told from that work's load: its median 0.6 is used" in \
        combined.notes["other_work"]
    assert combined.unstable == {"slow": {"device.contention": 0.6},
                                 "fast": {"device.contention": 0.0}}
    assert at_edge(combined, "fast").device.contention == 0.0
    # where it did not repeat either, the range still reaches 0 and its slowest repeat
    wobbly = _repeat(3.0e-3, 0.9, 100e-6, 2e9)
    combined = combine([busy, wobbly, busy], sizes, other_work=[1.0, 0.9, 0.8])
    assert combined.device.contention == 0.6
    assert combined.unstable["slow"]["device.contention"] == 0.9
    assert combined.unstable["fast"]["device.contention"] == 0.0
    # a profile without contention to speak of (a GPU's, one rank) gets no range for it
    assert combine([_repeat(2.0e-3, 0.0, 100e-6, 2e9)] * 2, sizes,
                   other_work=[1.0, 1.0]).unstable == {}


def test_other_work_counts_what_is_not_ours():
    import subprocess
    import sys

    from ratrain.profiling.other_work import OtherWork, machine_busy_s
    if machine_busy_s() is None:
        pytest.skip("no /proc/stat on this system")
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    # not ours: an orphan, whose parent started it and exited
    orphan = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {spin!r}])"
    subprocess.run([sys.executable, "-c", orphan], check=True)
    with OtherWork() as w:
        # 0.6 s of CPU, counted from clock ticks: 0.5 s of it came back as 0.49999999999994
        ours = subprocess.run([sys.executable, "-c", spin.replace("1.0", "0.6")])
    assert ours.returncode == 0
    assert w.own_s >= 0.5
    assert w.cores > 0.3  # the spinning orphan, which ran the whole time


@pytest.mark.parametrize("one, every, cores, efficiency", [
    ([1.0, 2.0], [0.5, 1.0], 2, 1.0),     # twice as fast on 2 cores: linear
    ([1.0, 2.0], [1.0, 1.0], 2, 0.5),     # 1.5x on 2
    ([1.0, 2.0], [1.0, 1.0], 4, 1 / 6),   # 1.5x on 4
    ([1.0, 2.0], [2.0, 2.0], 2, 0.0),     # slower on every core: no gain, not a loss
    ([1.0, 2.0], [0.2, 0.5], 2, 1.0),     # faster than linear (noise): linear
])
def test_thread_efficiency_is_what_each_thread_beyond_the_first_adds(one, every, cores,
                                                                      efficiency):
    from ratrain.profiling.fits import thread_efficiency_of
    alone = {"block": one + [0.1, 0.2], "block_every_core": every}  # + split halves, unread
    assert thread_efficiency_of(alone, cores) == pytest.approx(efficiency)
    assert thread_efficiency_of({"block": one}, cores) is None  # a GPU's: not measured
    assert thread_efficiency_of(alone, 1) is None


def _spin_rank(seconds: float) -> None:
    import time
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


@pytest.mark.dist
def test_ranks_forked_by_the_fork_server_count_as_ours(tmp_path):
    """The launcher's ranks are children of a fork server that outlives them: their CPU time
    is ours all the same (until 2026-11-27 a quiet machine's profile read its own two ranks as
    1.4 cores of other work and set its repeats aside)."""
    from ratrain.profiling.other_work import OtherWork, machine_busy_s
    from ratrain.runtime.launch import launch_local
    if machine_busy_s() is None:
        pytest.skip("no /proc/stat on this system")
    with OtherWork() as w:
        launch_local(2, _spin_rank, (1.0,), tmp_path / "errors")
    assert w.own_s >= 2.0


# --- compute rates ---------------------------------------------------------------------------------


def _priced_block_s(profile, model: str, seq_len: int, micro: int) -> float:
    """A block's forward + backward as the simulator prices it from the profile's rates."""
    from ratrain.schedule.plan import build_plan
    from ratrain.sim.cost_model import StageCosts
    from ratrain.sim.placement import stage_setups

    m = get_preset(model)
    setup = stage_setups(build_plan(m.n_layers, 1, 1, 1), m, profile, micro_batch_size=micro,
                         seq_len=seq_len, dtype="float32")[0]
    return StageCosts(setup).forward(1) + StageCosts(setup).backward(1)


def test_the_rates_price_the_profiled_block_at_its_measured_time_and_attention_apart():
    """Attention's core timed alone gets its own efficiency, the rest of the block the rest:
    priced from the rates, the profiled shape costs what was measured, and a longer sequence
    pays attention's FLOPs at attention's rate (on our CPU a quarter of the rest's)."""
    cfg = profiling.profile_config("tiny", 256, 2, "float32")
    per_rank = [{"matmul_s": {"float32": 2 * 1024**3 / 60e9}}]
    block, attention_s = UnitTimes(0.019, 0.035), 0.0137
    rates = fits.compute_rates(cfg, "cpu", per_rank, block, attention_s)
    rate = rates["float32"]
    assert rate.peak_flops == pytest.approx(60e9)
    assert rate.attention_efficiency < rate.efficiency / 3
    profile = load_profile("cpu-local")
    profile.device.compute, profile.measured = rates, []
    assert _priced_block_s(profile, "tiny", 256, 2) == pytest.approx(0.054)
    # the same 512 tokens as one sequence: the products cost the same, attention twice
    longer = _priced_block_s(profile, "tiny", 512, 1)
    assert longer == pytest.approx(0.054 + attention_s)
    # one rate for everything (an older profile) would have priced it far cheaper
    profile.device.compute = fits.compute_rates(cfg, "cpu", per_rank, block, 0.0)
    assert profile.device.compute["float32"].attention_efficiency is None
    assert _priced_block_s(profile, "tiny", 256, 2) == pytest.approx(0.054)
    assert _priced_block_s(profile, "tiny", 512, 1) < 0.054 + attention_s / 2


def test_a_gpus_host_bandwidth_is_merged_judged_and_kept_in_the_file():
    sizes = [4096.0, 1 << 20]
    repeats = []
    for host_bw in (9.5e10, 1.0e11, 5.0e10):
        profile = _repeat(2.0e-3, 0.0, 100e-6, 2e9)
        profile.device.host_memory_bandwidth = host_bw
        repeats.append(profile)
    combined = combine(repeats, sizes)
    assert combined.device.host_memory_bandwidth == 9.5e10
    assert "device.host_memory_bandwidth spread" in combined.notes["stability"]
    assert at_edge(combined, "slow").device.host_memory_bandwidth == 5.0e10
    again = from_dict(yaml.safe_load(yaml.safe_dump(combined.to_dict())))
    assert again.device.host_memory_bandwidth == 9.5e10
    _, rows = summary_rows(again)
    assert ["host memory bandwidth (AdamW on the host)", "95 GB/s"] in rows


def test_a_gpus_host_tier_has_its_link_its_update_rate_its_memory_and_no_collectives(
        monkeypatch):
    """What `ratrain profile` writes of a GPU's host tier, from its measurements: the slower
    direction of pinned copies, AdamW's rate over the pinned host parameters, each GPU's share
    of the host memory available and of AdamW's rate (eight ranks update at once; a GPU
    profile had no host memory until 2026-11-27, so a DiLoCo option
    needing 150 GiB a node was offered on 125 GiB nodes), and no host collectives (as the GPU
    presets: NCCL cannot reduce host memory, so a plan on the measured profile sums host-homed
    gradients on the GPUs)."""
    import torch

    from ratrain.profiling.ranks import ADAMW_SHAPES, LINK_SIZES

    monkeypatch.setattr(fits, "available_host_bytes", lambda: 96 * 2**30)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    slow, fast = Link(20e9, 10e-6), Link(25e9, 10e-6)
    per_rank = [{"host_copies_s": {"host_to_device": [fast.time(n) for n in LINK_SIZES],
                                   "device_to_host": [slow.time(n) for n in LINK_SIZES]}}]
    notes = {}
    tier = fits.host_tier(per_rank, {"host_adamw_s": 0.02}, notes)
    assert tier["host_collectives"] is False
    assert tier["host_link"].bandwidth == pytest.approx(slow.bandwidth, rel=1e-6)
    params = sum(a * b for a, b in ADAMW_SHAPES["host"])
    assert tier["host_memory_bandwidth"] == pytest.approx(28 * params / 0.02 / 8)
    assert "/ 8 GPUs of the node" in notes["device.host_memory_bandwidth"]
    assert tier["host_memory_bytes"] == 12 * 2**30
    note = notes["device.host_memory_bytes"]
    assert "103.08 GB: MemAvailable" in note and "/ 8 GPUs of the node" in note
    assert set(notes) == {"device.host_link", "device.host_memory_bandwidth",
                          "device.host_memory_bytes"}
    monkeypatch.setattr(fits, "available_host_bytes", lambda: None)  # not known: unbounded
    assert "host_memory_bytes" not in fits.host_tier(per_rank, {"host_adamw_s": 0.02}, {})


def test_split_halves_are_taken_to_the_whole_runs_footing_by_the_blocks_forward():
    from ratrain.profiling.ranks import split_halves

    whole = {"embedding": [0.001, 0.002], "block": [0.020, 0.040], "head": [0.003, 0.006]}
    # the zbh1 run came while the machine ran 25% slower: its forward took 25 ms, not 20
    split = {"split block forward": 0.025, "split embedding": [0.0001, 0.0025],
             "split block": [0.030, 0.022], "split head": [0.0045, 0.003]}
    halves = split_halves(whole, split)
    assert halves["block"] == pytest.approx([0.024, 0.0176])
    assert halves["embedding"] == pytest.approx([0.00008, 0.002])
    assert halves["head"] == pytest.approx([0.0036, 0.0024])
    # on the same footing the split costs what it costs: (BI + BW) / B = 1.04, not 1.3
    assert sum(halves["block"]) / whole["block"][1] == pytest.approx(1.04)
