"""--sync diloco:...:islands=K in the simulator and the planner (schedule/outer_sync.py): each
island's per-step gradient sum and loss on its own ring (a node's link where it is a node's
replicas), the outer sync as a slice of the delta across the islands and an all-gather within
the island at WOS, the delta in flight in the ledger, and the low-communication option that
names islands where a stage's replicas span nodes, several to a node."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ratrain.models.presets import get_preset
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.outer_sync import step_programs
from ratrain.schedule.plan import build_plan
from ratrain.sim import low_comm, unit_costs as uc
from ratrain.sim.cost_model import OPS, StageCosts
from ratrain.sim.links import Link, LinkClass, ring, ring_half
from ratrain.sim.outer_period import outer_bytes_per_replica, outer_period
from ratrain.sim.outer_sync import OUTER_STEP_BYTES_PER_PARAM, delta_bytes
from ratrain.sim.placement import stage_setups
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate
from ratrain.sim.stage_memory import StageMemory

from .cli_runner import run_cli

MODEL = get_preset("tiny")
SHAPE = {"micro_batch_size": 2, "seq_len": 256, "dtype": "float32"}
SLOW = Link(100e6 / 8, 1e-3)  # 100 Mbit/s between nodes


def nodes_of_two(base: str = "cpu-local", per_node: int = 2):
    """`base` with nodes of `per_node` devices (their own links kept) joined by 100 Mbit/s."""
    return dataclasses.replace(load_profile(base), name=f"nodes-of-{per_node}",
                               devices_per_node=per_node, inter_node=LinkClass(SLOW, SLOW))


def costs(plan, profile, stage: int = 0) -> StageCosts:
    return StageCosts(stage_setups(plan, MODEL, profile, **SHAPE)[stage])


def duration(c: StageCosts, op: Op, unit: int | None = None) -> float:
    return OPS[op].duration(c, Action(op, unit))


def test_the_island_ring_is_a_nodes_and_the_across_ring_joins_the_nodes():
    profile = nodes_of_two()
    intra, inter = profile.intra_node.collective, profile.inter_node.collective
    s = stage_setups(build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:4:islands=2"), MODEL,
                     profile, **SHAPE)[0]
    assert (s.island_ring, s.across_ring, s.replicas) == (intra, inter, inter)
    assert (s.sync_replicas, s.sync_ring) == (2, intra)
    for sync, replicas in (("step", 4), ("diloco:4", 1)):
        plain = stage_setups(build_plan(MODEL.n_layers, 1, 4, 1, sync=sync), MODEL, profile,
                             **SHAPE)[0]
        assert plain.island_ring is None and plain.across_ring is None
        assert (plain.sync_replicas, plain.sync_ring) == (replicas, inter)
    # ranks by stage under dp-pp: an island's two replicas are ranks 0 and 2, a node apart
    s = stage_setups(build_plan(MODEL.n_layers, 2, 4, 2, sync="diloco:4:islands=2",
                                rank_order="dp-pp"), MODEL, profile, **SHAPE)[1]
    assert s.island_ring == inter


def test_an_islands_gradient_sum_and_loss_stay_on_its_nodes_link():
    """pp 1, dp 4 on two nodes of two devices: synchronous, every GS crosses the nodes' link
    among 4; with islands=2, among the island's 2 on the node's link."""
    profile = nodes_of_two()
    intra, inter = profile.intra_node.collective, profile.inter_node.collective
    sync = costs(build_plan(MODEL.n_layers, 1, 4, 1), profile)
    islands = costs(build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:4:islands=2"), profile)
    for u in range(MODEL.n_units):
        nbytes = 4 * uc.param_count(MODEL, u)
        assert duration(sync, Op.GRAD_SYNC, u) == pytest.approx(ring(inter, nbytes, 4))
        assert duration(islands, Op.GRAD_SYNC, u) == pytest.approx(ring(intra, nbytes, 2))
        assert duration(islands, Op.GRAD_SYNC, u) < duration(sync, Op.GRAD_SYNC, u) / 10
    assert duration(islands, Op.STEP_END) == pytest.approx(ring(intra, 8, 2))
    assert duration(sync, Op.STEP_END) == pytest.approx(ring(inter, 8, 4))
    # the inner step sums its gradients again (GS in its program), yet far faster
    plan = build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:4:islands=2")
    assert any(a.op is Op.GRAD_SYNC for a in plan.programs[0])
    synchronous = simulate(build_plan(MODEL.n_layers, 1, 4, 1), MODEL, profile, **SHAPE)
    assert simulate(plan, MODEL, profile, **SHAPE).step_time < synchronous.step_time / 3


def test_the_outer_sync_carries_a_slice_across_and_the_wait_gathers_it():
    """Each replica all-reduces 1/(dp/K) of the padded delta over the K islands (OS); WOS
    all-gathers the island's sums within it, blocking, then takes the outer step."""
    # islands of 3: the embedding's 131,072 parameters are padded to 131,073
    profile = nodes_of_two("cpu-local", per_node=3)
    intra, inter = profile.intra_node.collective, profile.inter_node.collective
    plan = build_plan(MODEL.n_layers, 1, 6, 1, sync="diloco:1:islands=2")
    whole = build_plan(MODEL.n_layers, 1, 6, 1, sync="diloco:1")
    c, w = costs(plan, profile), costs(whole, profile)
    for u in range(MODEL.n_units):
        n = uc.param_count(MODEL, u)
        padded = -(-n // 3) * 3
        assert padded == (131073 if u == 0 else n)
        assert delta_bytes(c, u) == 4 * padded and delta_bytes(w, u) == 4 * n
        # a third of the whole delta's ring across the two islands (its latency aside)
        assert duration(c, Op.OUTER_SYNC, u) == pytest.approx(ring(inter, 4 * padded / 3, 2))
        latency = 2 * inter.latency
        assert duration(c, Op.OUTER_SYNC, u) - latency == pytest.approx(
            (ring(inter, 4 * padded, 2) - latency) / 3)
        assert duration(w, Op.OUTER_SYNC, u) == pytest.approx(ring(inter, 4 * n, 6))
        assert OPS[Op.WAIT_OUTER_SYNC].blocking(c, Action(Op.WAIT_OUTER_SYNC, u)) \
            == pytest.approx(ring_half(intra, 4 * padded, 3))
        assert OPS[Op.WAIT_OUTER_SYNC].blocking(w, Action(Op.WAIT_OUTER_SYNC, u)) == 0.0
    # in a synced step each WOS runs its gather and the outer step after the sum arrived
    synced = simulate(dataclasses.replace(plan, programs=step_programs(plan, 0)), MODEL,
                      profile, **SHAPE).ranks[0]
    bandwidth = profile.device.memory_bandwidth
    arrived = {sp[0]: sp[2] for sp in synced.spans}
    for a, start, end in synced.actions:
        if a.op is Op.WAIT_OUTER_SYNC:
            gather = ring_half(intra, delta_bytes(c, a.unit), 3)
            step = OUTER_STEP_BYTES_PER_PARAM * uc.param_count(MODEL, a.unit) / bandwidth
            begun = max(start, arrived[str(Action(Op.OUTER_SYNC, a.unit))])
            assert end - begun >= gather + step - 1e-12, a


def test_the_outer_bytes_per_replica_are_its_slices_across_the_islands():
    plan = build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:8:bf16:islands=2")
    slices = sum(-(-uc.param_count(MODEL, u) // 2) for u in range(MODEL.n_units))
    assert outer_bytes_per_replica(plan, MODEL) == [round(2 * 1 / 2 * 2 * slices)]
    whole = outer_bytes_per_replica(build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:8:bf16"),
                                    MODEL)
    assert whole[0] == pytest.approx(3 * outer_bytes_per_replica(plan, MODEL)[0], abs=8)


def test_the_ledger_holds_the_padded_delta_from_os_to_wos():
    """The runtime sums its slice of the whole delta, padded to a multiple of the island's
    replicas, in place, and gathers the island's sums back into it (runtime/outer_sync.py):
    `outer_delta`, held from OS u until WOS u; the outer state stays."""
    profile = nodes_of_two("cpu-local", per_node=3)  # the embedding's delta padded by one
    for sync, held in (("diloco:1:islands=2", lambda n: 4 * (-(-n // 3) * 3)),
                       ("diloco:1:bf16:islands=2", lambda n: 2 * (-(-n // 3) * 3)),
                       ("diloco:1", lambda n: 4 * n)):
        plan = build_plan(MODEL.n_layers, 1, 6, 1, sync=sync)
        program = step_programs(plan, 0)[0]
        memory = StageMemory(costs(plan, profile), program, False)
        total = memory.at_start
        for a, after in zip(program, memory.changes):
            if a.op is Op.OUTER_SYNC:
                assert after - total == held(uc.param_count(MODEL, a.unit)), (sync, a)
            if a.op is Op.WAIT_OUTER_SYNC:
                assert total - after == held(uc.param_count(MODEL, a.unit)), (sync, a)
            total = after if after is not None else total
        # every delta released by the step's end, and nothing else (the outer state stays)
        assert total == memory.at_start


def test_islands_are_weighed_where_a_stages_replicas_span_nodes_several_to_a_node():
    plan = build_plan(MODEL.n_layers, 1, 4, 1)
    assert low_comm.islands_of(plan, nodes_of_two()) == 2
    assert low_comm.islands_of(plan, nodes_of_two(per_node=1)) is None  # one replica a node
    assert low_comm.islands_of(plan, nodes_of_two(per_node=4)) is None  # all on one node
    assert low_comm.islands_of(build_plan(MODEL.n_layers, 1, 6, 1), nodes_of_two(per_node=4)) \
        is None  # 6 replicas on nodes of 4: islands of unequal size
    # dp-pp on nodes of 2: each stage's replicas on 4 nodes, one a node
    assert low_comm.islands_of(build_plan(MODEL.n_layers, 2, 4, 2, rank_order="dp-pp"),
                               nodes_of_two()) is None
    assert low_comm.islands_of(build_plan(MODEL.n_layers, 2, 4, 2), nodes_of_two()) == 2
    # host-homed state on GPUs whose collectives cannot reach the host: an island's per-step
    # sum runs on the device first, as the synchronous plan's does (device_grad_sum), or not
    # at all
    gpus = nodes_of_two("h100-80g-ib")
    assert low_comm.islands_of(plan, gpus) == 2
    host = build_plan(MODEL.n_layers, 1, 4, 1, state_home="host", view_window=1)
    assert low_comm.islands_of(host, gpus) is None
    summed = build_plan(MODEL.n_layers, 1, 4, 1, state_home="host", view_window=1,
                        device_grad_sum=True)
    assert low_comm.islands_of(summed, gpus) == 2
    assert low_comm.diloco_plan(summed, "diloco:50:islands=2").device_grad_sum
    assert not low_comm.diloco_plan(summed, "diloco:50").device_grad_sum  # nothing summed


def test_the_option_on_two_nodes_of_two_is_islands_of_a_node():
    """dp 4 over two nodes of two devices and 100 Mbit/s between them: hierarchical DiLoCo
    hides its syncs (each replica carries half the delta across, among 2, not the whole among
    4) and is the option named."""
    profile = nodes_of_two()
    plan = build_plan(MODEL.n_layers, 1, 4, 1)
    low = low_comm.price(plan, MODEL, profile,
                         simulate(plan, MODEL, profile, **SHAPE).step_time, **SHAPE)
    assert low.worth_it
    best = low.best
    assert best.islands == 2 and best.sync.endswith(":islands=2") and best.hidden
    assert best.mean_step_s <= (1 + low_comm.HIDDEN) * low.inner_s
    plain = [o for o in low.options if not o.islands]
    assert plain and all(o.bytes_per_period > 2.9 * best.bytes_per_period for o in plain)
    hidden_plain = min(o.every for o in plain if o.hidden)
    assert best.every <= hidden_plain
    period = outer_period(low_comm.diloco_plan(plan, best.sync), MODEL, profile, **SHAPE)
    assert period.mean_step_time == pytest.approx(best.mean_step_s)
    text = low_comm.advice(low, 4 * 2 * 256)
    assert f"--sync {best.sync}" in text and "hierarchical DiLoCo: 2 islands" in text
    assert "never chosen for you" in text


def test_plan_offers_the_islands_option(monkeypatch, capsys, tmp_path):
    profile = tmp_path / "nodes.yaml"
    nodes_of_two().save(profile)
    args = ("plan", "--model", "tiny", "--profile", str(profile), "--devices", "4",
            "--global-batch", "8", "--pp", "1")
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    option = json.loads(stdout)["low_communication"]
    assert option["islands"] == 2 and option["sync"].endswith(":islands=2")
    assert option["dp"] == 4 and option["changes_algorithm"] is True
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    offer = [line for line in stdout.splitlines() if line.startswith("low-communication option")]
    assert len(offer) == 1 and f"--sync {option['sync']}" in offer[0], stdout


def test_a_sharded_islands_outer_state_and_delta_are_its_slices():
    """--shard-state with islands: each replica holds 1/(dp/K) of its island's state, the
    outer state too; its delta is its slice's, summed across the islands, with no gather."""
    profile = nodes_of_two()
    inter = profile.inter_node.collective
    sharded = build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:1:islands=2", shard_state=True,
                         view_window=1)
    whole = build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:1:islands=2", view_window=1)
    c, w = costs(sharded, profile), costs(whole, profile)
    assert c.s.shard_replicas == 2 and c.s.shard_link == c.s.island_ring  # over the island
    for u in range(MODEL.n_units):
        size = uc.shard(MODEL, u, 2).size
        assert delta_bytes(c, u) == 4 * size
        assert duration(c, Op.OUTER_SYNC, u) == pytest.approx(ring(inter, 4 * size, 2))
        assert OPS[Op.WAIT_OUTER_SYNC].blocking(c, Action(Op.WAIT_OUTER_SYNC, u)) == 0.0
    synced = [StageMemory(x, step_programs(p, 0)[0], False).at_peak
              for x, p in ((c, sharded), (w, whole))]
    # AdamW's 8 bytes and the outer 8 a parameter, halved (a few bytes of AdamW step counters)
    assert synced[0]["optimizer"] == pytest.approx(synced[1]["optimizer"] / 2, rel=1e-3)


def test_shard_state_under_diloco_needs_islands_and_no_shard_group():
    from ratrain.schedule.errors import ScheduleError

    with pytest.raises(ScheduleError, match="shard each island's state"):
        build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:4", shard_state=True, view_window=1)
    with pytest.raises(ScheduleError, match="--shard-group 2 sums each shard"):
        build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:4:islands=2", shard_state=True,
                   view_window=1, shard_group=2)
    plan = build_plan(MODEL.n_layers, 1, 4, 1, sync="diloco:4:islands=2", shard_state=True,
                      view_window=1)
    assert not any(a.op is Op.CROSS_SYNC for a in plan.programs[0])  # no sum across islands


def test_a_sharded_plan_is_offered_islands_sharded_within_them():
    profile = nodes_of_two()
    sharded = build_plan(MODEL.n_layers, 1, 4, 1, shard_state=True, view_window=1)
    step_s = simulate(sharded, MODEL, profile, **SHAPE).step_time
    low = low_comm.price(sharded, MODEL, profile, step_s, **SHAPE)
    assert low is not None and low.options
    assert all(o.islands == 2 and o.sync.endswith(":islands=2") for o in low.options)
    built = low_comm.diloco_plan(sharded, low.best.sync)
    assert built.shard_state and built.grad_sync_dp == 2
    one_node = dataclasses.replace(profile, devices_per_node=4)  # no islands: nothing to offer
    assert low_comm.price(sharded, MODEL, one_node, step_s, **SHAPE) is None
