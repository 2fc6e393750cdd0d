"""The low-communication option (sim/low_comm.py, planner/low_comm.py): priced where the link
between replicas is too slow for a sync every step, offered beside `ratrain plan`'s plans and
marked as changing the algorithm, never one of them, and absent where the link is fast."""

from __future__ import annotations

import dataclasses
import json

from ratrain.models.presets import get_preset
from ratrain.schedule.plan import build_plan
from ratrain.sim import low_comm
from ratrain.sim.links import Link, LinkClass
from ratrain.sim.outer_period import outer_period
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate

from .cli_runner import run_cli

MODEL = get_preset("tiny")
SHAPE = {"micro_batch_size": 2, "seq_len": 256, "dtype": "float32"}


def two_nodes(mbit: float):
    """cpu-local with each rank a node of its own, joined by a link of `mbit` Mbit/s."""
    link = Link(mbit * 1e6 / 8, 1e-3)
    return dataclasses.replace(load_profile("cpu-local"), name=f"two-nodes-{mbit:g}mbit",
                               devices_per_node=1, inter_node=LinkClass(link, link))


def priced(profile, **plan_args):
    plan = build_plan(MODEL.n_layers, 1, 2, 1, **plan_args)
    return low_comm.price(plan, MODEL, profile, simulate(plan, MODEL, profile, **SHAPE).step_time,
                          **SHAPE)


def test_a_slow_link_is_worth_avoiding_and_the_smallest_hiding_period_is_named():
    low = priced(two_nodes(100))
    assert low.worth_it and low.exposed_s > low.inner_s  # 13.7 MB a step over 100 Mbit/s
    for option in low.options:
        assert option.hidden
        assert option.mean_step_s <= (1 + low_comm.HIDDEN) * low.inner_s
        smaller = [h for h in low_comm.PERIODS if h < option.every and h >= (option.fragments or 1)]
        if smaller:  # the period before it does not hide the sync: it is the smallest that does
            plan = low_comm.diloco_plan(build_plan(MODEL.n_layers, 1, 2, 1), option.sync)
            period = dataclasses.replace(outer_period(plan, MODEL, two_nodes(100), **SHAPE),
                                         every=smaller[-1])
            assert period.mean_step_time > (1 + low_comm.HIDDEN) * low.inner_s
    assert low.best.every == min(o.every for o in low.options)
    assert {o.fragments for o in low.options} == set(low_comm.FRAGMENTS)
    # a slower link needs a longer period
    assert priced(two_nodes(10)).best.every > low.best.every


def test_a_fast_link_is_not_worth_it_and_some_plans_cannot_run_diloco():
    assert not priced(load_profile("cpu-local")).worth_it
    slow = two_nodes(100)
    assert priced(slow, policy="baseline") is None
    assert priced(slow, shard_state=True, view_window=0) is None
    plan = build_plan(MODEL.n_layers, 2, 1, 2)
    assert low_comm.price(plan, MODEL, slow, 1.0, **SHAPE) is None  # one replica


def test_plan_offers_it_beside_the_plans_marked_and_never_writes_it(monkeypatch, capsys, tmp_path):
    profile = tmp_path / "slow.yaml"
    two_nodes(100).save(profile)
    out = tmp_path / "plan.json"
    args = ("plan", "--model", "tiny", "--profile", str(profile), "--devices", "2",
            "--global-batch", "4", "--pp", "1")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0, stderr
    offer = [line for line in stdout.splitlines() if line.startswith("low-communication option")]
    assert len(offer) == 1
    assert "changes the algorithm; not a plan above" in offer[0]
    assert "--sync diloco:" in offer[0] and "never chosen for you" in offer[0]
    # over this link the fastest synchronous plan is one replica: the option says which it is of
    assert "not listed: plan 1 runs" in offer[0]
    assert "sync" not in json.loads(out.read_text())
    code, stdout, _ = run_cli(monkeypatch, capsys, *args, "--json")
    summary = json.loads(stdout)
    option = summary["low_communication"]
    assert option["changes_algorithm"] is True and option["dp"] == 2
    assert option["sync"].startswith("diloco:") and option["hidden"] is True
    assert option["tokens_per_s"] > 2 * 4 * 256 / option["step_time_s"]
    assert all("sync" not in p for p in summary["plans"])


def test_plan_offers_nothing_over_a_fast_link(monkeypatch, capsys):
    code, stdout, _ = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                              "cpu-local", "--devices", "2", "--global-batch", "4", "--pp", "1")
    assert code == 0 and "low-communication" not in stdout
