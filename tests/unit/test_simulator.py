"""The simulator: hand-computable programs give their known step time, bubble, ring all-reduce
time and memory; and on the executor's own programs it predicts the executor's ledger peak."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.schedule.ledger import KINDS
from ratrain.models.presets import get_preset
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.plan import build_plan
from ratrain.sim import unit_costs as uc
from ratrain.sim.cost_model import DURATIONS, OPS, SHARDED_OPS, StageCosts, ops_for
from ratrain.sim.profile import Link, MeasuredShape, UnitTimes, load_profile
from ratrain.sim.placement import stage_setups
from ratrain.sim.simulator import simulate

FAST = Link(bandwidth=1e30, latency=0.0)


def _profile(f: float = 1.0, b: float = 2.0, **device):
    """Units that take f forward and b backward; links, updates and overheads free."""
    p = load_profile("cpu-local")
    p.measured = [MeasuredShape("tiny", 256, 2, "float32", UnitTimes(f, b), UnitTimes(f, b),
                                UnitTimes(f, b), block_forward_no_grad_s=f)]
    p.device = dataclasses.replace(p.device, **{"cores": None, "memory_bandwidth": 1e30,
                                                "action_overhead_s": 0.0, **device})
    for links in (p.intra_node, p.inter_node):
        links.p2p = links.collective = FAST
    return p


def _model(n_layers: int):
    m = get_preset("tiny")
    m.n_layers = n_layers
    return m


@pytest.mark.parametrize("n_micro", [2, 4, 7])
def test_two_stage_1f1b_step_time_and_bubble(n_micro):
    """Stages of 2 units (f=1, b=2 each): per micro-batch 2 forward and 4 backward per stage;
    1F1B takes (m + p - 1)(t_f + t_b) and idles (p - 1)/(m + p - 1) of it on every stage."""
    plan = build_plan(2, 2, 1, n_micro, clip=False)
    r = simulate(plan, _model(2), _profile(), micro_batch_size=2, seq_len=256)
    assert r.step_time == pytest.approx((n_micro + 1) * 6)
    for stage in r.ranks:
        assert stage.bubble == pytest.approx(1 / (n_micro + 1))
    assert r.tokens_per_s == pytest.approx(n_micro * 2 * 256 / r.step_time)


def test_gpipe_and_1f1b_take_the_same_time_on_equal_stages():
    one_f_one_b = simulate(build_plan(2, 2, 1, 4, clip=False), _model(2), _profile(),
                           micro_batch_size=2, seq_len=256)
    gpipe = simulate(build_plan(2, 2, 1, 4, schedule="gpipe", clip=False), _model(2), _profile(),
                     micro_batch_size=2, seq_len=256)
    assert gpipe.step_time == pytest.approx(one_f_one_b.step_time)


@pytest.mark.parametrize("dp", [2, 3, 8])
def test_grad_sync_takes_the_ring_formula(dp):
    p = _profile(f=0.0, b=0.0)
    ring = Link(bandwidth=1e8, latency=1e-3)
    p.intra_node.collective = ring
    plan = build_plan(2, 1, dp, 1, clip=False)
    r = simulate(plan, _model(2), p, micro_batch_size=2, seq_len=256)
    spans = {name: t1 - t0 for name, t0, t1 in r.ranks[0].spans}
    nbytes = 4 * uc.param_count(_model(2), 1)
    assert spans["GS1"] == pytest.approx(2 * (dp - 1) / dp * nbytes / 1e8 + 2 * (dp - 1) * 1e-3)


@pytest.mark.parametrize("cores,contention,pp,dp,slowdown", [
    (2, 0.0, 1, 2, 1.0),    # two replicas on two cores: each has its own
    (2, 0.25, 1, 2, 1.25),  # ... but they share caches and memory bandwidth
    (2, 0.25, 1, 1, 1.0),   # alone: no contention
    (2, 0.25, 1, 4, 2.5),   # four replicas on two cores: half a core each, and contended
    (4, 0.3, 1, 2, 1.1),    # two of four cores busy: a third of the contention
])
def test_compute_shares_the_cores_and_contends_for_the_node(cores, contention, pp, dp, slowdown):
    """Every replica of one stage computes at once: a unit takes its time alone x the
    slowdown (processor sharing, then 1 + contention x (busy - 1) / (cores - 1))."""
    alone = simulate(build_plan(2, pp, 1, 2, clip=False), _model(2), _profile(cores=cores),
                     micro_batch_size=2, seq_len=256)
    shared = simulate(build_plan(2, pp, dp, 2, clip=False), _model(2),
                      _profile(cores=cores, contention=contention), micro_batch_size=2, seq_len=256)
    assert shared.ranks[0].compute == pytest.approx(slowdown * alone.ranks[0].compute)


@pytest.mark.parametrize("cores,threads,efficiency,contention,pp,dp,speedup", [
    (2, 2, None, 0.0, 1, 1, 2.0),    # one process on both cores: twice one thread's speed
    (2, 2, 0.5, 0.0, 1, 1, 1.5),     # ... where its second thread adds half a thread's
    (2, 2, None, 0.25, 1, 1, 2.0),   # contention counts ranks: its own threads' is measured
    (4, 8, None, 0.0, 1, 1, 4.0),    # more threads than cores: the cores' speed
    (4, 8, 0.5, 0.0, 1, 1, 2.5),
    (2, 2, None, 0.0, 1, 2, 1.0),    # two ranks of two threads on two cores: one core each
    (4, 2, None, 0.0, 2, 1, 2.0),    # two stages of two threads on four cores
])
def test_a_rank_on_several_threads_runs_as_many_cores_as_it_gets(cores, threads, efficiency,
                                                                    contention, pp, dp, speedup):
    """The profile's times are one thread's; a rank of `threads` threads keeps that many cores
    busy and, on the t it gets, runs 1 + (t - 1) x the profile's thread efficiency as fast (a
    single process on a CPU keeps torch's default of all cores)."""
    plan = build_plan(2, pp, dp, 2, clip=False)
    profile = _profile(cores=cores, contention=contention, thread_efficiency=efficiency)
    one = simulate(plan, _model(2), profile, micro_batch_size=2, seq_len=256)
    several = simulate(plan, _model(2), profile, micro_batch_size=2, seq_len=256,
                       threads_per_rank=threads)
    assert several.ranks[0].compute == pytest.approx(one.ranks[0].compute / speedup)
    gpu = _profile()  # no cores to share: the profile's times are the device's
    assert simulate(plan, _model(2), gpu, micro_batch_size=2, seq_len=256,
                    threads_per_rank=threads).step_time == pytest.approx(
        simulate(plan, _model(2), gpu, micro_batch_size=2, seq_len=256).step_time)


@pytest.mark.parametrize("cores, per_node, world, asked, threads", [
    (16, 64, 1, None, 16),  # one process: torch's default of every core
    (16, 64, 2, None, 8),  # ranks that share a node split its cores
    (16, 64, 3, None, 5),
    (16, 64, 32, None, 1),  # at least one each
    (16, 1, 4, None, 16),  # each rank alone on its node
    (16, 64, 2, 3, 3),  # --threads
    (None, 8, 2, None, 1),  # a GPU profile's ranks: threads not priced
])
def test_ranks_are_priced_on_the_threads_train_gives_them(cores, per_node, world, asked, threads):
    """The rule of training/prepare.threads_per_rank on a profile's nodes (a CPU profile's
    `cores`), so that `simulate` and the planner price the threads `train` runs on."""
    from ratrain.sim.shared_cores import threads_of_rank

    profile = _profile(cores=cores)
    profile.devices_per_node = per_node
    assert threads_of_rank(profile, world, asked) == threads


@pytest.mark.parametrize("devices_per_node,slowed", [(2, True), (1, False)])
def test_a_sync_between_local_ranks_takes_its_share_of_the_cores(devices_per_node, slowed):
    """On a CPU a collective between ranks of one node is copies and reductions on its cores:
    while the top block's sync runs (d seconds), the two replicas' next backward (1 s of work)
    shares two cores with two communication threads, so it runs at half speed and takes
    1 + d/2. Between nodes the link, not the cores, does the work."""
    p = _profile(f=0.5, b=1.0, cores=2)
    p.devices_per_node = devices_per_node
    p.intra_node.collective = p.inter_node.collective = Link(bandwidth=4e6, latency=0.0)
    r = simulate(build_plan(2, 1, 2, 1, clip=False), _model(2), p, micro_batch_size=2,
                 seq_len=256)
    spans = {name: t1 - t0 for name, t0, t1 in r.ranks[0].spans}
    took = {str(a): end - start for a, start, end in r.ranks[0].actions}
    assert 0.1 < spans["GS2"] < 2.0  # block 2's sync overlaps block 1's backward
    assert took["B3.0"] == pytest.approx(1.0)  # the head's: nothing in flight yet
    for unit, sync in ((2, "GS3"), (1, "GS2")):
        assert took[f"B{unit}.0"] == pytest.approx(1.0 + spans[sync] / 2 if slowed else 1.0)


def test_syncs_share_the_link_in_the_order_they_start():
    p = _profile(f=0.0, b=0.0)
    p.intra_node.collective = Link(bandwidth=1e8, latency=0.0)
    r = simulate(build_plan(2, 1, 2, 1, clip=False), _model(2), p, micro_batch_size=2, seq_len=256)
    spans = sorted((s for s in r.ranks[0].spans if s[0].startswith("GS")), key=lambda s: s[1])
    assert [n for n, _, _ in spans] == ["GS3", "GS2", "GS1", "GS0"]
    assert all(a[2] == pytest.approx(b[1]) for a, b in zip(spans, spans[1:]))  # back to back
    assert r.step_time == pytest.approx(sum(t1 - t0 for _, t0, t1 in spans), rel=1e-5)  # + E


def test_a_slow_link_is_exposed_and_ratrain_hides_it_where_baseline_cannot():
    p = _profile(f=0.5, b=1.0)
    p.intra_node.collective = Link(bandwidth=4 * uc.param_count(_model(4), 1), latency=0.0)  # 1 s a block
    times = {policy: simulate(build_plan(4, 1, 2, 1, policy=policy, clip=False), _model(4), p,
                              micro_batch_size=2, seq_len=256) for policy in ("ratrain", "baseline")}
    assert times["ratrain"].step_time < times["baseline"].step_time
    assert times["baseline"].ranks[0].exposed > times["ratrain"].ranks[0].exposed


def test_every_op_has_a_cost_and_its_kind_comes_from_the_registry():
    assert set(OPS) == set(Op) == set(DURATIONS)
    assert set(ops_for(True)) == set(Op) and set(SHARDED_OPS) <= set(Op)
    for table in (OPS, ops_for(True)):
        for op, cost in table.items():
            assert cost.kind in {"compute", "copy", "send", "recv", "sync", "norm", "wait", "step_end",
                                 "free", "host", "pair"}
            assert callable(cost.duration), op
    kinds = {op: cost.kind for op, cost in OPS.items()}
    assert kinds[Op.FORWARD] == kinds[Op.UPDATE] == "compute"
    assert (kinds[Op.START_UPDATE], kinds[Op.WAIT_UPDATE]) == ("host", "wait")
    assert (kinds[Op.TIED_SYNC], kinds[Op.WAIT_TIED_SYNC]) == ("pair", "wait")
    assert (kinds[Op.SEND_ACT], kinds[Op.RECV_GRAD]) == ("send", "recv")
    assert (kinds[Op.GRAD_SYNC], kinds[Op.GRAD_NORM], kinds[Op.STEP_END]) == ("sync", "norm", "step_end")
    assert (kinds[Op.PREFETCH], kinds[Op.RELEASE], kinds[Op.WAIT_PREFETCH]) == ("copy", "free", "wait")
    assert ops_for(False) is OPS
    assert ops_for(True)[Op.PREFETCH].kind == "sync"  # an all-gather on the replicas' links


def test_every_storage_the_registry_names_has_a_size():
    """The executor binds every storage name of the registry's memory effects to tensors; the
    cost model must size every one of them (for a block, the head and the embedding); sharded
    with a gradient lifetime shorter than the step, so that the full gradient is a storage."""
    from ratrain.schedule.ops import SPECS, Hold
    plan = build_plan(2, 1, 2, 2, activation="offload", view_window=1, shard_state=True,
                      grad_lifetime="transient")
    setup = stage_setups(plan, _model(2), _profile(), micro_batch_size=2, seq_len=16,
                         dtype="float32")[0]
    costs = StageCosts(setup)
    names = {(op, name) for op, spec in SPECS.items() for e in spec.memory
             if isinstance(e, Hold) for name in e.storages}
    assert names
    for op, name in names:
        if name == "grad_run":  # host-homed runs only: sized in tests/unit/test_unit_major.py
            continue
        for u in (0, 1, 3):
            a = Action(op, u, 0 if SPECS[op].mb else None)
            sizes = [nbytes for _, nbytes in costs.storages(name, a)]
            assert all(n >= 0 for n in sizes), (op, name, u)
            if u == 1:  # a block has something in every storage
                assert sizes and all(n > 0 for n in sizes), (op, name)


def test_memory_timeline_of_a_small_program_is_hand_computable():
    """One stage, one micro-batch, keep: before the step the states; the peak right after the
    head's forward: states + every unit's output and saved tensors + the rotary tables (one
    cached storage for all blocks) + the step's tokens and targets (each one int64 tensor)."""
    m = _model(2)
    plan = build_plan(2, 1, 1, 1, clip=False)
    r = simulate(plan, m, _profile(), micro_batch_size=2, seq_len=256)
    shape = uc.UnitShape(m, 2, 256)
    n = sum(uc.param_count(m, u) for u in range(4))
    tensors = sum(uc.param_tensors(m, uc.unit_kind(m, u)) for u in range(4))
    states = 16 * n + 4 * tensors
    tokens = 2 * 256 * 8
    acts = sum(uc.saved_bytes(shape, uc.unit_kind(m, u)) + uc.output_bytes(shape, uc.unit_kind(m, u))
               for u in range(4))
    timeline = r.ranks[0]
    assert timeline.memory[0][1] == states
    assert timeline.peak == states + acts + uc.table_bytes(shape, "block") + 2 * tokens
    assert timeline.memory[-1][1] == states  # everything of the step let go
    assert set(timeline.at_peak) == set(KINDS)


D, F, V = 256, 688, 512  # tiny: dim, MLP, vocabulary
TINY_SIZES = [[V * D], [D, D * D, D * D, D * D, D * D, D, D * F, D * F, F * D],
              [D, D * D, D * D, D * D, D * D, D, D * F, D * F, F * D], [D, V * D]]
"""The parameter tensors of tiny with 2 blocks, unit by unit, as its modules list them."""


def _slice(sizes: list[int], dp: int) -> tuple[int, int, int]:
    """Replica 0's slice of a unit sharded over dp: (S, N_pad, tensors it meets)."""
    n = sum(sizes)
    s = -(-n // dp)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return s, s * dp, sum(1 for start in starts if start < s)


def _sharded_setup(dp: int, bandwidth: float = 1e9, link: Link = Link(1e8, 1e-3),
                   host_link: Link | None = None):
    p = _profile(f=0.0, b=0.0)
    p.device = dataclasses.replace(p.device, memory_bandwidth=bandwidth, host_link=host_link)
    for links in (p.intra_node, p.inter_node):
        links.collective = link
    plan = build_plan(2, 1, dp, 1, clip=True, view_window=0, shard_state=True)
    return plan, simulate(plan, _model(2), p, micro_batch_size=2, seq_len=256)


@pytest.mark.parametrize("dp", [2, 7])
@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_sharded_gather_sync_update_and_norm_take_their_formulas(dp, device):
    """Sharded state over dp replicas (fp32, S = ceil(N / dp), N_pad = dp S): P is a cast of
    the slice ((4 + 4) S at memory bandwidth) and a ring all-gather of the 4 N_pad-byte view,
    GS a ring reduce-scatter of the 4 N_pad-byte gradient ((dp-1)/dp of it, dp-1 latencies;
    on a CPU, gloo's, twice that: an all-reduce), U updates S parameters (36 bytes each with
    clipping), N reads 4 S bytes a unit and then sums over the replicas, blocking (a ring
    all-reduce of 4 bytes)."""
    bw, link = 1e9, Link(1e8, 1e-3)
    plan, r = _sharded_setup(dp, bw, link, Link(1e10, 1e-5) if device == "gpu" else None)
    timeline = r.ranks[0]
    spans = {name: t1 - t0 for name, t0, t1 in timeline.spans}
    actions = {str(a): (t0, t1) for a, t0, t1 in timeline.actions}
    half = lambda nbytes: (dp - 1) / dp * nbytes / link.bandwidth + (dp - 1) * link.latency  # noqa: E731
    for u, sizes in enumerate(TINY_SIZES):
        s, padded, _ = _slice(sizes, dp)
        assert spans[f"P{u}"] == pytest.approx(8 * s / bw + half(4 * padded), rel=1e-12)
        sync = half(4 * padded) * (2 if device == "cpu" else 1)
        assert spans[f"GS{u}"] == pytest.approx(sync, rel=1e-12)
        t0, t1 = actions[f"U{u}"]
        assert t1 - t0 == pytest.approx(36 * s / bw, rel=1e-12)
    t0, t1 = actions["N"]
    assert t1 - t0 == pytest.approx(sum(4 * _slice(sizes, dp)[0] for sizes in TINY_SIZES) / bw)
    # the walker sums over the replicas before it goes on (pp=1: the pipeline's part is free)
    all_reduce = 2 * (dp - 1) / dp * 4 / link.bandwidth + 2 * (dp - 1) * link.latency
    first_update = min(t for a, (t, _) in actions.items() if a.startswith("U"))
    assert first_update - t1 == pytest.approx(all_reduce, rel=1e-9)
    # the gathers run one after another on the replicas' links before the first forward
    assert actions["F0.0"][0] == pytest.approx(sum(spans[f"P{u}"] for u in range(4)), rel=1e-12)


@pytest.mark.parametrize("home, host_bw", [("device", None), ("host", None), ("host", 1e8)])
def test_a_gpus_views_and_state_work_are_priced_where_they_run(home, host_bw):
    """On a device with a host link (a GPU), bf16 views, one unit ahead, two micro-batches:
    from masters on the device a view is a cast there ((4 + 2) N at memory bandwidth), from
    host-homed masters their 4 N fp32 bytes over the link and then that cast (the copy engine
    casts on the device: torch's copy_ across devices and dtypes converted on the host). A
    host-homed state's update (32 N with clipping: the fused AdamW scales as it reads and
    writes the gradient back; 36 N on the device, scaled first), norm (4 N) and gradient
    fold (12 N, in the backward) run at the host's bandwidth where the profile has one (measured on 2026-11-26:
    an H200's host updated 20x slower than its device), else at the device's; its first fold
    of the step is a copy into the zero accumulation, off the compute timeline."""
    bw, host_link = 1e9, Link(1e7, 1e-5)
    p = _profile(f=0.0, b=0.0)
    p.measured = [dataclasses.replace(p.measured[0], dtype="bfloat16")]
    p.device = dataclasses.replace(p.device, memory_bandwidth=bw, host_link=host_link,
                                   host_memory_bandwidth=host_bw)
    plan = build_plan(2, 1, 1, 2, clip=True, view_window=1, state_home=home)
    timeline = simulate(plan, _model(2), p, micro_batch_size=2, seq_len=256,
                        dtype="bfloat16").ranks[0]
    spans = {name: t1 - t0 for name, t0, t1 in timeline.spans}
    actions = {str(a): t1 - t0 for a, t0, t1 in timeline.actions}
    state_bw = host_bw if home == "host" and host_bw else bw
    for u, sizes in enumerate(TINY_SIZES):
        n = sum(sizes)
        view = (host_link.time(4 * n) if home == "host" else 0.0) + 6 * n / bw
        assert spans[f"P{u}"] == pytest.approx(view, rel=1e-12)
        update = 32 if home == "host" else 36
        assert actions[f"U{u}"] == pytest.approx(update * n / state_bw, rel=1e-12)
        fold = 12 * n / state_bw
        assert actions[f"B{u}.0"] == pytest.approx(0.0 if home == "host" else fold, rel=1e-12)
        assert actions[f"B{u}.1"] == pytest.approx(fold, rel=1e-12)
    total = sum(map(sum, TINY_SIZES))
    assert actions["N"] == pytest.approx(4 * total / state_bw, rel=1e-12)


@pytest.mark.parametrize("dp", [2, 3, 7])
def test_memory_of_a_sharded_program_is_hand_computable(dp):
    """Replica 0 holds per unit: masters 4 S, gradients 4 (N_pad + S) (the whole accumulation
    buffer and the shard's), AdamW 8 S + 4 per tensor its slice meets (allocated at the first
    update: a steady-state step starts with it), the resident view 4 N_pad (fp32 here)."""
    plan, r = _sharded_setup(dp)
    masters = gradients = optimizer = views = 0
    for sizes in TINY_SIZES:
        s, padded, pieces = _slice(sizes, dp)
        masters += 4 * s
        gradients += 4 * (padded + s)
        optimizer += 8 * s + 4 * pieces
        views += 4 * padded
    timeline = r.ranks[0]
    assert timeline.held_before_training == masters + gradients
    assert timeline.memory[0][1] == masters + gradients + optimizer + views
    assert timeline.memory[-1][1] == masters + gradients + optimizer + views  # views stay
    at_peak = timeline.at_peak
    assert (at_peak["masters"], at_peak["gradients"], at_peak["optimizer"], at_peak["views"]) == (
        masters, gradients, optimizer, views)


def test_sharded_views_in_a_window_are_held_from_gather_to_release():
    m = _model(2)
    plan = build_plan(2, 1, 2, 1, clip=True, view_window=1, shard_state=True)
    r = simulate(plan, m, _profile(), micro_batch_size=2, seq_len=256)
    views = [4 * _slice(sizes, 2)[1] for sizes in TINY_SIZES]
    assert r.ranks[0].at_peak["views"] <= max(a + b for a, b in zip(views, views[1:]))
    assert r.ranks[0].memory[-1][1] == r.ranks[0].memory[0][1]  # nothing resident between steps


def _executor_ledger(cfg: RunConfig, plan, steps: int = 2) -> int:
    from ratrain.runtime.engine import PipelineEngine

    engine = PipelineEngine(cfg, plan, None, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    t = cfg.train
    w = torch.randint(0, cfg.model.vocab_size, (t.global_batch, t.seq_len + 1), generator=g)
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()  # as the loader gives them
    batches = list(zip(x.split(t.micro_batch_size), y.split(t.micro_batch_size)))
    for _ in range(steps):
        engine.train_step(batches, 1e-3)
    return engine.stage.ledger.peak


@pytest.mark.parametrize("activation,window", [("keep", None), ("recompute", None),
                                               ("offload", None), ("keep", 1), ("recompute", 0)])
def test_predicted_peak_equals_the_executors_ledger(activation, window):
    cfg = RunConfig(model=_model(2))
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 6, 2
    plan = build_plan(2, 1, 1, 3, activation=activation, view_window=window)
    predicted = simulate(plan, cfg.model, _profile(), micro_batch_size=2, seq_len=64).ranks[0].peak
    measured = _executor_ledger(cfg, plan)
    assert abs(predicted - measured) <= 64, (predicted, measured)  # a few scalars' rounding


def test_simulate_command(tmp_path, monkeypatch, capsys):
    import json

    from .cli_runner import run_cli

    def run(*args):
        return run_cli(monkeypatch, capsys, "simulate", *args)
    code, out, _ = run("--pp", "2", "--activation", "recompute,keep", "--json",
                       "--trace", str(tmp_path / "sim.json"))
    assert code == 0
    got = json.loads(out)
    assert got["pp"] == 2 and got["step_time_s"] > 0 and 0 < got["bubble"] < 1
    stage0, stage1 = got["stages"]
    assert stage0["peak_by_kind"]["activations"] < stage1["peak_by_kind"]["activations"] * 2
    trace = json.loads((tmp_path / "sim.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
    code, out, _ = run("--model", "llama2-7b", "--profile", "mt3000", "--pp", "8", "--dp", "4",
                       "--seq-len", "4096", "--global-batch", "32", "--micro-batch-size", "1",
                       "--dtype", "float16", "--activation", "recompute", "--state-home", "host",
                       "--view-window", "1")
    assert code == 0 and "mt3000" in out and "fits 20.00 GB (host 4.00 GB)" in out
    # 16 bytes a parameter of an eighth of 7B is over mt3000's 4 GB host tier on every stage
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert len(rows) == 8 and all(row[8:10] == ["NO:", "host"] for row in rows), out
    code, _, err = run("--profile", "no-such-profile")
    assert code == 2 and "no hardware profile 'no-such-profile'" in err
    assert len(err.strip().splitlines()) == 1
