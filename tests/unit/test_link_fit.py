"""What a multi-node run makes of its link probe (sim/link_fit.py, training/link_profile.py):
the alpha-beta fit, each link in its class, the schedule chosen on the result, the
low-communication hint, and which runs probe at all."""

from __future__ import annotations

import pytest

from ratrain.config import RunConfig
from ratrain.schedule.grid import RankGrid
from ratrain.setup import Machine, run_plan
from ratrain.sim.link_fit import fit, measured_profile
from ratrain.sim.profile import load_profile
from ratrain.setup.links import MeasuredLinks, low_comm_hint
from ratrain.training import link_profile

SIZES = [1 << 16, 1 << 20, 1 << 22]
BW, LAT = 100e6 / 8, 1e-3  # 100 Mbit/s, 1 ms


def ring_times(k: int, bw: float = BW, lat: float = LAT) -> list[float]:
    return [2 * (k - 1) * lat + 2 * (k - 1) / k * n / bw for n in SIZES]


def test_the_fit_recovers_bandwidth_and_latency():
    link = fit(SIZES, ring_times(2), factor=1.0, hops=2)
    assert link.bandwidth == pytest.approx(BW, rel=1e-6)
    assert link.latency == pytest.approx(LAT, rel=1e-6)
    sends = fit(SIZES, [LAT + n / BW for n in SIZES])
    assert sends.bandwidth == pytest.approx(BW, rel=1e-6) and sends.latency == pytest.approx(LAT)
    noisy = fit(SIZES, [1e-4, 0.01, 0.2])  # bending up: the line would start below 0
    assert noisy.latency == 0.0 and noisy.bandwidth > 0


def test_each_link_lands_in_its_class():
    base = load_profile("cpu-local")
    # pp=2 dp=2, pp-dp: stage 0's replicas are ranks 0, 1 (node 0), stage 1's 2, 3 (node 1)
    grid = RankGrid(2, 2, "pp-dp")
    fast = ring_times(2, bw=1e9, lat=1e-5)
    profile, words = measured_profile(base, grid, 2, SIZES, [fast, fast],
                                      [[LAT + n / BW for n in SIZES]])
    assert profile.devices_per_node == 2 and profile.name == "cpu-local + measured links"
    assert profile.inter_node.p2p.bandwidth == pytest.approx(BW, rel=1e-6)
    assert profile.intra_node.collective.bandwidth == pytest.approx(1e9, rel=1e-6)
    assert profile.inter_node.collective == base.inter_node.collective  # not measured: kept
    assert profile.intra_node.p2p == base.intra_node.p2p
    assert words.startswith("within a node: all-reduce 8 Gbit/s")
    assert "between nodes: send 100 Mbit/s (1 ms latency)" in words
    # two stages' rings of one class: the slower one is the class's
    profile, _ = measured_profile(base, RankGrid(2, 2, "dp-pp"), 1, SIZES,
                                  [ring_times(2), ring_times(2, bw=BW / 2)], [])
    assert profile.inter_node.collective.bandwidth == pytest.approx(BW / 2, rel=1e-6)


def _cfg(pp=1, dp=2) -> RunConfig:
    cfg = RunConfig()
    cfg.parallel.pp, cfg.parallel.dp = pp, dp
    cfg.train.global_batch, cfg.train.micro_batch_size = 4, 2
    return cfg


def test_the_schedule_is_chosen_on_the_measured_links_and_the_hint_follows_them():
    slow, _ = measured_profile(load_profile("cpu-local"), RankGrid(1, 2, "pp-dp"), 1, SIZES,
                               [ring_times(2)], [])
    said: list[str] = []
    cfg = _cfg()
    plan = run_plan(cfg, Machine(world=2), profile=slow, say=said.append)
    assert "on cpu-local + measured links" in said[0]
    hint = low_comm_hint(cfg, plan, slow)
    assert hint.startswith("low-communication mode (not switched on): ")
    assert "--sync diloco:" in hint and "never chosen for you" in hint
    assert cfg.parallel.sync == "step"  # offered, not switched on
    # priced on the ranks' threads, as the schedule was chosen (it was one thread always)
    assert low_comm_hint(cfg, plan, slow, threads_per_rank=2) != hint
    fast = load_profile("cpu-local")
    cfg = _cfg()
    assert low_comm_hint(cfg, run_plan(cfg, Machine(world=2), profile=fast), fast) is None


def test_the_setup_stage_chooses_on_the_links_its_machine_measured():
    """run_plan with a Machine that carries measured links (what training/prepare.py hands it
    across nodes): it says the figures, chooses on them and gives the hint, as on the profile
    built from them directly."""
    links = MeasuredLinks(1, tuple(SIZES), (tuple(ring_times(2)),), (), 0.25)
    said: list[str] = []
    cfg = _cfg()
    plan = run_plan(cfg, Machine(world=2, links=links), say=said.append)
    assert said[0].startswith("links measured at the start (0.2 s, no --profile given)")
    assert any(line.startswith("low-communication mode (not switched on): ") for line in said)
    slow, _ = measured_profile(load_profile("cpu-local"), RankGrid(1, 2, "pp-dp"), 1, SIZES,
                               [ring_times(2)], [])
    again = _cfg()
    assert run_plan(again, Machine(world=2), profile=slow).to_dict() == plan.to_dict()
    assert cfg.parallel.sync == "step"


@pytest.mark.parametrize("env, changes, probes", [
    ({}, {}, False),  # a local run: its ranks are started by ratrain, no torchrun
    ({"LOCAL_WORLD_SIZE": "1"}, {}, True),  # two nodes of one rank
    ({"LOCAL_WORLD_SIZE": "2"}, {}, False),  # one node
    ({"LOCAL_WORLD_SIZE": "1"}, {"profile": "cpu-local"}, False),  # the user's profile
    ({"LOCAL_WORLD_SIZE": "1"}, {"schedule": "1f1b"}, False),  # nothing to choose
    # torchrun started 3 processes for a layout of 2: the rule says so, no probe of rank 2
    ({"LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "3"}, {}, False),
])
def test_which_runs_probe(monkeypatch, env, changes, probes):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    if env:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    cfg = _cfg()
    if "profile" in changes:
        cfg.train.profile = changes["profile"]
    if "schedule" in changes:
        cfg.parallel.schedule = changes["schedule"]
    assert link_profile.wants_probe(cfg) is probes
