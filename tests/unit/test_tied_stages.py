"""Tied embeddings across pipeline stages in the IR, the checks, the simulator and checkpoints:
TS and WTS on the two ends of the pipeline only, where the gradient is final and before what
reads it; a plan that leaves them out, or a deadlock through them, is refused; the simulator
pairs the two ends and sizes the head's copy; a checkpoint holds the one-stage form."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.models.llama import build_units
from ratrain.runtime.optim import make_optimizer
from ratrain.runtime.stage import Stage
from ratrain.runtime.tied_copy import shared_head, split_head
from ratrain.schedule.errors import ScheduleConfigError, ScheduleError
from ratrain.schedule.ir import Action, format_program
from ratrain.schedule.ops import Op
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim.cost_model import StageCosts
from ratrain.sim.placement import stage_setups
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate

from .executor_ledger import small_model

TS, WTS = Op.TIED_SYNC, Op.WAIT_TIED_SYNC


def _tied_model():
    return dataclasses.replace(small_model(), tie_embeddings=True)


@pytest.mark.parametrize("kw", [
    dict(pp=2, dp=1), dict(pp=2, dp=2), dict(pp=3, dp=1, clip=False), dict(pp=2, dp=2, clip=False),
    dict(pp=2, dp=1, policy="baseline"), dict(pp=2, dp=2, schedule="zbh1"),
    dict(pp=2, dp=1, view_window=1, state_home="host", update="carried"),
    dict(pp=2, dp=1, view_window=1, micro_batch_group=2),
])
def test_each_end_sums_its_copy_once_after_its_gradient_is_final(kw):
    pp, dp = kw.pop("pp"), kw.pop("dp")
    n_micro = 4
    plan = build_plan(3, pp, dp, n_micro, tie_embeddings=True, **kw)
    head = plan.stage_units[-1].stop - 1
    ends = {0: 0, pp - 1: head}
    assert plan.tied_ends == ends and plan.shared_views == {}
    for s, program in enumerate(plan.programs):
        tied = [a for a in program if a.op in (TS, WTS)]
        if s not in ends:
            assert tied == []
            continue
        u = ends[s]
        assert tied == [Action(TS, u), Action(WTS, u)]
        at = program.index
        last_backward = max(i for i, a in enumerate(program)
                            if a.unit == u and a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT))
        assert at(Action(TS, u)) > last_backward
        if dp > 1:
            assert at(Action(TS, u)) > at(Action(Op.WAIT_GRAD_SYNC, u))
        readers = [i for i, a in enumerate(program)
                   if a in (Action(Op.GRAD_NORM), Action(Op.UPDATE, u), Action(Op.START_UPDATE, u),
                            Action(Op.START_NORM, u))]
        assert readers and at(Action(WTS, u)) < min(readers)
        if kw.get("clip") is False and kw.get("update") != "carried":
            # nothing to wait for but the other end: the unit's update goes last
            updates = [a.unit for a in program if a.op is Op.UPDATE]
            assert updates[-1] == u
    back = PipelinePlan.from_dict(plan.to_dict())
    assert back.programs == plan.programs and back.tie_embeddings
    back.validate()


def test_untied_plans_and_one_stage_tied_plans_have_no_tied_sum():
    for plan in (build_plan(3, 2, 2, 4), build_plan(3, 1, 1, 4, tie_embeddings=True)):
        assert not any(a.op in (TS, WTS) for program in plan.programs for a in program)
        assert plan.tied_ends == {}


def test_a_plan_file_that_leaves_the_sum_out_or_adds_it_is_refused():
    data = build_plan(3, 2, 1, 4, tie_embeddings=True).to_dict()
    dropped = {**data, "programs": [" ".join(t for t in p.split() if t not in ("TS0", "WTS0",
                                                                           "TS4", "WTS4"))
                                    for p in data["programs"]]}
    with pytest.raises(ScheduleError, match=r"tie_embeddings True over 2 stages, but the "
                                            r"programs of stages \[\]"):
        PipelinePlan.from_dict(dropped).validate()
    untied = {k: v for k, v in data.items() if k != "tie_embeddings"}
    with pytest.raises(ScheduleError, match=r"tie_embeddings False .* stages \[0, 1\]"):
        PipelinePlan.from_dict(untied).validate()


def test_a_deadlock_through_the_tied_sum_is_found():
    """The last stage waits for the sum before it sends stage 0 the gradient that stage 0's
    last backward (and so its TS) needs: no order of the two programs completes."""
    plan = build_plan(3, 2, 1, 2, tie_embeddings=True, clip=False)
    last = format_program(plan.programs[1]).split()
    last.remove("WTS4")
    last.insert(last.index("SG2.1"), "WTS4")
    data = {**plan.to_dict(), "programs": [format_program(plan.programs[0]), " ".join(last)]}
    with pytest.raises(ScheduleError, match=r"deadlock: .*stage 1 waits WTS4 \(stage 0 has not "
                                            r"started its TS\)"):
        PipelinePlan.from_dict(data).validate()


@pytest.mark.parametrize("change, needle", [
    (dict(shard_state=True, dp=2, view_window=1), "which --shard-state slices over the replicas"),
    (dict(sync="diloco:4:2", dp=2), r"--sync diloco:4:2 cuts apart .* use --sync diloco:4"),
])
def test_what_tied_stages_do_not_run_with_is_refused(change, needle):
    with pytest.raises(ScheduleConfigError, match=needle):
        build_plan(3, change.pop("pp", 2), change.pop("dp"), 4, tie_embeddings=True, **change)


@pytest.mark.parametrize("sync", ["diloco:2", "diloco:3:1"])
def test_diloco_with_one_fragment_syncs_both_copies_in_the_same_step(sync):
    """Every step's programs (with the outer sync where it is due) pass the checks and the
    dry run, both ends updating their copy before its outer delta is taken."""
    from ratrain.schedule.outer_sync import step_programs

    plan = build_plan(3, 2, 2, 4, tie_embeddings=True, sync=sync, clip=False)
    plan.validate()
    synced = [s for s in range(6) if any(a.op is Op.OUTER_SYNC for p in step_programs(plan, s)
                                         for a in p)]
    assert synced
    for s in synced:
        first, last = step_programs(plan, s)
        assert Action(Op.OUTER_SYNC, 0) in first and Action(Op.OUTER_SYNC, 4) in last


def test_the_simulator_runs_the_sum_once_both_ends_issued_it_and_sizes_the_copy():
    model, profile = _tied_model(), load_profile("h100-80g-ib")
    plan = build_plan(model.n_layers, 2, 1, 4, tie_embeddings=True)
    result = simulate(plan, model, profile, micro_batch_size=2, seq_len=64)
    first, last = result.ranks
    spans = [{n: (a, b) for n, a, b in r.spans if n.startswith("TS")} for r in result.ranks]
    assert spans[0]["TS0"] == spans[1]["TS3"]  # one all-reduce, the same span at both ends
    issued = {str(a): t for r in result.ranks for a, t, _ in r.actions if a.op is TS}
    assert spans[0]["TS0"][0] == pytest.approx(max(issued.values()))
    assert spans[0]["TS0"][1] - spans[0]["TS0"][0] > 0
    # the head's stage holds the copy's state: as an untied model's head
    untied = dataclasses.replace(model, tie_embeddings=False)
    alone = simulate(build_plan(model.n_layers, 2, 1, 4), untied, profile,
                     micro_batch_size=2, seq_len=64).ranks
    assert last.peak == alone[1].peak and first.peak == alone[0].peak


def test_the_stages_hold_the_state_the_simulator_counts():
    """Built for real, each end's masters and gradients in the ledger are the simulator's."""
    cfg = RunConfig(model=_tied_model())
    plan = build_plan(cfg.model.n_layers, 2, 1, 4, tie_embeddings=True)
    setups = stage_setups(plan, cfg.model, load_profile("h100-80g-ib"), micro_batch_size=2,
                          seq_len=64, dtype="float32")
    for units, setup in zip(plan.stage_units, setups):
        stage = Stage(cfg, units, torch.device("cpu"))
        want = {}
        for _, kind, _, nbytes in StageCosts(setup).state_owners():
            want[kind] = want.get(kind, 0) + nbytes
        assert stage.ledger.total == want["masters"] + want["gradients"]
    head = Stage(cfg, plan.stage_units[1], torch.device("cpu")).state[units.stop - 1]
    assert head.tied_copy and head.params[head.tied].shape == (cfg.model.vocab_size, cfg.model.dim)


def test_a_checkpoint_holds_the_head_as_one_stage_has_it():
    """shared_head drops the copy, its AdamW state and its part of the outer state (--sync
    diloco); split_head makes them again from the embedding's: the round trip gives back the
    head's state, and the one-stage head's state has the shared form's structure."""
    from types import SimpleNamespace

    cfg = _tied_model()
    embedding, head = build_units(cfg, 0, [0])[0], build_units(cfg, 0, [cfg.n_units - 1])[0]
    train = RunConfig().train
    opts = [make_optimizer(list(m.parameters()), train) for m in (embedding, head)]
    for m, opt in zip((embedding, head), opts):
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    head.lm_head.weight.data.copy_(embedding.embed_tokens.weight)  # the copies are equal
    opts[1].state[head.lm_head.weight] = {k: v.clone() for k, v in
                                         opts[0].state[embedding.embed_tokens.weight].items()}
    d, n = cfg.dim, cfg.vocab_size * cfg.dim
    unit = SimpleNamespace(optimizer=opts[1], masters=list(head.parameters()), tied=1,
                           offsets=[0, d], sizes=[d, n])  # the head's UnitState, as it sees it
    assert unit.masters[1] is head.lm_head.weight
    outer = {k: torch.randn(d + n) for k in ("params", "momentum")}
    outer = {k: torch.cat([v[:d], outer["params"][d:] if k == "params" else v[d:]])
             for k, v in outer.items()}
    split = {"weights": head.state_dict(), "optim": opts[1].state_dict(), "outer": outer}
    shared = shared_head(split, unit)
    assert set(shared["weights"]) == {"norm.weight"}
    assert all(torch.equal(shared["outer"][k], v[:d]) for k, v in outer.items())
    one_stage_head = build_units(cfg, 0)[-1]
    one_opt = make_optimizer([one_stage_head.norm.weight], train)
    one_stage_head.norm.weight.grad = torch.zeros_like(one_stage_head.norm.weight)
    one_opt.step()
    assert shared["optim"]["param_groups"][0]["params"] == [0]
    assert len(shared["optim"]["param_groups"]) == len(one_opt.state_dict()["param_groups"])
    embedding_state = {"weights": embedding.state_dict(), "optim": opts[0].state_dict(),
                       "outer": {k: v[d:].clone() for k, v in outer.items()}}
    back = split_head(shared, embedding_state, unit)
    assert all(torch.equal(back["outer"][k], v) for k, v in outer.items())
    assert back["weights"].keys() == split["weights"].keys()
    for name, t in split["weights"].items():
        assert torch.equal(back["weights"][name], t)
    assert back["optim"]["param_groups"] == split["optim"]["param_groups"]
    for i, state in split["optim"]["state"].items():
        for key, t in state.items():
            assert torch.equal(back["optim"]["state"][i][key], t), (i, key)


def test_the_planner_sizes_the_heads_copy_where_the_tie_crosses_stages():
    """Its unit tables, which bound and balance layouts, hold the head's copy at pp > 1 (as an
    untied head's state) and not at pp 1; its best pipelined plan sums the tie."""
    from ratrain.models.presets import get_preset
    from ratrain.planner.layouts import Layout, PlanRequest
    from ratrain.planner.lifecycle import Lifecycle
    from ratrain.planner.search import UnitTables, search

    model = get_preset("llama3.2-1b")
    request = PlanRequest(model=model, profile=load_profile("h100-80g-ib"), devices=2,
                          global_batch=8, seq_len=1024, dtype="bfloat16", top=1,
                          pipeline_degrees=(2,))
    life = Lifecycle("device", 0, "ratrain")
    head = model.n_units - 1
    tables = UnitTables(request)
    split, one = (tables.table(Layout(pp, 3 - pp, 1, 8 // (3 - pp), "pp-dp", life, "mixed"), 0)
                  for pp in (2, 1))
    untied = UnitTables(dataclasses.replace(request, model=dataclasses.replace(
        model, tie_embeddings=False))).table(Layout(2, 1, 1, 8, "pp-dp", life, "mixed"), 0)
    assert split.state[head] == untied.state[head] > 100 * one.state[head]
    best = search(request).best[0]
    assert best.plan.pp == 2 and best.plan.tied_ends == {0: 0, 1: head}
