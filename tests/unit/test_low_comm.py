"""The low-communication option (sim/low_comm.py, planner/low_comm.py): priced where the link
between replicas is too slow for a sync every step, offered beside `ratrain plan`'s plans and
marked as changing the algorithm, never one of them, and absent where the link is fast."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from ratrain.config import RunConfig
from ratrain.data.corpus import stdlib_files
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


def _text(tmp_path):
    """A small corpus (a stdlib file) for the runs of these tests."""
    data = tmp_path / "text"
    data.mkdir(exist_ok=True)
    shutil.copy(next(f for f in stdlib_files() if f.name == "textwrap.py"), data)
    return data


def two_nodes(mbit: float):
    """cpu-local with each rank a node of its own, joined by a link of `mbit` Mbit/s."""
    link = Link(mbit * 1e6 / 8, 1e-3)
    return dataclasses.replace(load_profile("cpu-local"), name=f"two-nodes-{mbit:g}mbit",
                               devices_per_node=1, inter_node=LinkClass(link, link))


def priced(profile, steps=None, **plan_args):
    plan = build_plan(MODEL.n_layers, 1, 2, 1, **plan_args)
    return low_comm.price(plan, MODEL, profile, simulate(plan, MODEL, profile, **SHAPE).step_time,
                          steps, **SHAPE)


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


def test_a_short_run_is_offered_only_periods_that_sync_it_twice():
    """`ratrain plan --steps 100` offered diloco:500 until 2026-11-29: replicas that would
    meet only at the run's end."""
    hiding = priced(two_nodes(10)).best.every
    short = priced(two_nodes(10), steps=2 * hiding - 1)
    assert short.options and all(2 * o.every <= 2 * hiding - 1 for o in short.options)
    assert not short.best.hidden
    assert priced(two_nodes(10), steps=2 * low_comm.PERIODS[0] - 1) is None


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
            "--global-batch", "4", "--pp", "1", "--steps", "1000")  # (H <= steps / 2)
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0, stderr
    offer = [line for line in stdout.splitlines() if line.startswith("low-communication option")]
    assert len(offer) == 1
    assert "changes the algorithm; not a plan above" in offer[0]
    assert "--sync diloco:" in offer[0] and "never chosen for you" in offer[0]
    # over this link the fastest synchronous plan is one replica: the option says which it is of
    assert "not listed: plan 1 runs" in offer[0]
    assert "sync" not in json.loads(out.read_text())
    # beside it, the option as a plan file of its own, which training runs as it is
    offered = json.loads((tmp_path / "plan.diloco.json").read_text())
    sync = offered["sync"]
    assert sync.startswith("diloco:") and offered["run"]["parallel"]["sync"] == sync
    assert offered["dp"] == 2 and offered["prediction"]["changes_algorithm"] is True
    assert f"wrote {tmp_path / 'plan.diloco.json'}: the low-communication option" in stdout
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", "plan.diloco.json", "--steps",
                           "2", "--data", str(_text(tmp_path)), "--no-progress", "--no-report",
                           "--run-dir", "run")
    assert code == 0, err
    assert RunConfig.load(tmp_path / "run" / "config.yaml").parallel.sync == sync
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["sync"] == sync
    # the synchronous plan with --sync: refused, not run as the plan says under another name
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(out), "--sync", sync,
                           "--no-progress")
    assert code == 2 and f"does not fit this run: sync=step (run has {sync})" in err, err
    code, _, err = run_cli(monkeypatch, capsys, *args, "--sync", "diloco:5")
    assert code == 2 and "--sync is not searched" in err, err
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


def gpu_nodes(mbit: float):
    """h100-80g-ib with each GPU a node of its own, joined by `mbit` Mbit/s: its NCCL cannot sum
    host memory (host_collectives false)."""
    link = Link(mbit * 1e6 / 8, 1e-3)
    return dataclasses.replace(load_profile("h100-80g-ib"), name=f"h100-nodes-{mbit:g}mbit",
                               devices_per_node=1, inter_node=LinkClass(link, link))


def _gpu_request(global_batch: int, mbit: float = 1000):
    from ratrain.planner.layouts import PlanRequest
    return PlanRequest(model=MODEL, profile=gpu_nodes(mbit), devices=2,
                       global_batch=global_batch, seq_len=256, budget=40e6, top=3)


def test_where_state_must_live_on_the_host_of_gpus_the_option_spans_replicas_with_it():
    """Under 40 MB tiny's state lives in host memory; over 1 Gbit/s every synchronous plan is
    one replica (a second would sum its gradients on the GPUs every step, in one group of the
    step's micro-batches) and the second GPU idles; DiLoCo's outer sync of host state runs over
    gloo, so the option is a layout on both GPUs whose micro-batches are not one group, said to
    run only with --sync diloco, and faster than plan 1."""
    from ratrain.planner import low_comm as planner_low_comm
    from ratrain.planner import search
    from ratrain.setup import rule

    found = search.search(_gpu_request(32))
    assert all(c.layout.dp == 1 and c.layout.lifecycle.state_home == "host" for c in found.best)
    o = planner_low_comm.offer(found)
    lay = o.candidate.layout
    assert o.rank is None and not o.synchronous
    assert lay.dp == 2 and lay.lifecycle.state_home == "host"
    # searched as the outer sync runs it: no gradient sum in its programs, nor in its bound
    from ratrain.schedule.ir import Op
    assert o.candidate.plan.sync != "step"
    assert not any(a.op == Op.GRAD_SYNC for program in o.candidate.plan.programs for a in program)
    tokens = o.candidate.result.tokens_per_s * o.candidate.step_time
    assert tokens / o.low.best.mean_step_s > found.best[0].result.tokens_per_s
    setup = dict(n_layers=MODEL.n_layers, pp=lay.pp, dp=lay.dp, global_batch=32,
                 micro_batch_size=lay.micro_batch_size, state_home="host",
                 view_window=lay.lifecycle.view_window, host_is_separate=True,
                 host_collectives=False)
    assert rule.refusal(**setup, sync=o.low.best.sync) is None
    assert lay.n_micro > 1 and lay.lifecycle.micro_batch_group != lay.n_micro
    group = lay.lifecycle.micro_batch_group
    assert "NCCL cannot reduce host memory" in rule.refusal(**setup, micro_batch_group=group)
    assert rule.refusal(**setup, micro_batch_group=lay.n_micro) is None
    text = planner_low_comm.describe(o)
    assert "which runs only with --sync diloco as laid out" in text
    assert f"its {lay.n_micro} micro-batches in one group" in text
    assert "synchronous plan" not in text
    assert planner_low_comm.to_dict(o)["runs_synchronously"] is False


def test_an_option_slower_than_plan_1_is_not_offered():
    """At 4 sequences a step the same layout on two GPUs, with its outer sync over 100 Mbit/s,
    would run slower than plan 1 on one: changing the algorithm would buy nothing. (At 8 it
    no longer does, since the inner steps' loss stopped crossing the replicas' link.)"""
    from ratrain.planner import low_comm as planner_low_comm
    from ratrain.planner import search

    request = _gpu_request(4, mbit=100)
    found = search.search(request)
    more = search.search(dataclasses.replace(request, min_dp=2, outer_sync=True))
    listed = [(None, more.best[0])]
    priced = planner_low_comm._first(request, listed, 0.0)  # against nothing: an option
    assert priced is not None and priced.low.worth_it and priced.low.options
    tokens = more.best[0].result.tokens_per_s * more.best[0].step_time
    first = found.best[0].result.tokens_per_s
    assert all(tokens / x.mean_step_s < first for x in priced.low.options)
    assert planner_low_comm._first(request, listed, first) is None
    assert planner_low_comm.offer(found) is None


def test_simulate_prices_a_diloco_run_over_its_period(monkeypatch, capsys, tmp_path):
    """`ratrain simulate --sync diloco:H:F` gives the inner step and, over a period of H
    steps, the mean step with each fragment's outer sync: what the run's throughput follows."""
    profile = tmp_path / "slow.yaml"
    two_nodes(100).save(profile)
    args = ("simulate", "--dp", "2", "--global-batch", "8", "--sync", "diloco:10:2",
            "--profile", str(profile))
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    period = summary["outer_period"]
    plan = build_plan(MODEL.n_layers, 1, 2, 2, sync="diloco:10:2")
    # each rank alone on a node of cpu-local's 2 cores: torch's default of both
    assert summary["threads_per_rank"] == 2
    want = outer_period(plan, MODEL, two_nodes(100), **SHAPE, threads_per_rank=2)
    assert period["every"] == 10 and len(period["exposed_sync_s"]) == 2
    assert period["mean_step_time_s"] == pytest.approx(want.mean_step_time, rel=1e-6)
    assert summary["step_time_s"] < period["mean_step_time_s"]  # the inner step: no sync
    # a fragment's ~7 MB take ~0.55 s at 100 Mbit/s, mostly under the step it overlaps
    assert all(0 < x < 0.55 for x in period["exposed_sync_s"])
    code, stdout, _ = run_cli(monkeypatch, capsys, *args)
    assert "--sync diloco:10:2: over a period of 10 steps" in stdout


def test_the_outer_sync_search_prunes_nothing_the_exhaustive_one_keeps():
    """Its bounds leave out the per-step gradient sum its plans do not have: they stay lower
    bounds, so the pruned search finds the exhaustive one's fastest plan."""
    from ratrain.planner import search

    request = dataclasses.replace(_gpu_request(32, mbit=100), min_dp=2, outer_sync=True,
                                  devices=4, budget=60e6)
    pruned, every = search.search(request), search.search(request, exhaustive=True)
    assert pruned.best[0].step_time == pytest.approx(every.best[0].step_time, rel=1e-9)
    assert every.simulated > pruned.simulated
    tables = search.UnitTables(request)
    for c in every.best:  # (exhaustive: every plan simulated)
        assert c.bound <= search.refine(request, tables, c) <= c.step_time * (1 + 1e-9), c.layout
