"""A bf16 gradient accumulation for host-homed state (PipelinePlan.host_grad_dtype,
--host-grad-dtype, runtime/host_grad.py): its update is AdamW on the rounded gradient, bit for
bit; the plan field and its refusals; the executor's ledger and the simulator's memory and
time; the planner's use of it under a host budget."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.models.llama import build_units
from ratrain.models.presets import get_preset
from ratrain.planner.layouts import PlanRequest
from ratrain.planner.search import search
from ratrain.runtime import host_grad
from ratrain.runtime.optim import make_optimizer
from ratrain.runtime.state_layout import Replicated
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim import unit_costs as uc
from ratrain.sim.profile import load_profile
from ratrain.sim.simulator import simulate

from .cli_runner import run_cli
from .executor_ledger import assert_simulated_ledger_is, executor_ledger, small_model

GPU = "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml"


def _unit(grad_dtype, seed=0):
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.LayerNorm(40))
    params = list(module.parameters())
    state = UnitState(params, lambda ps, decay=None: torch.optim.AdamW(ps, lr=1e-2, fused=True),
                      Replicated(torch.device("cpu"), grad_dtype), view_dtype=torch.float32)
    if grad_dtype != torch.float32:
        state.update_scratch = host_grad.update_scratch(state.sizes)
    return state


@pytest.mark.parametrize("chunk", [host_grad.CHUNK, 448, 64])  # whole parameters; chunks
@pytest.mark.parametrize("for_gpu", [False, True])  # AdamW scales as it reads: grad_scale
@pytest.mark.parametrize("factor", [None, 0.37])
def test_the_update_from_a_bf16_accumulation_is_adamw_on_the_rounded_gradient(
        factor, for_gpu, chunk, monkeypatch):
    """Three updates, each from a bf16 accumulation and from an fp32 one holding the same
    rounded gradient, clipping coefficient or not, the gradient cast and stepped a chunk at a
    time (the 1920-element weight in 5 chunks, the last one short, or in 30): masters and
    moments equal bit for bit, and the norm is the fp32 one's."""
    monkeypatch.setattr(host_grad, "CHUNK", chunk)
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: for_gpu))
    low, ref = _unit(torch.bfloat16), _unit(torch.float32)
    assert low.update_scratch.numel() == min(chunk, max(low.sizes))
    assert low.grad.dtype == torch.bfloat16 and all(m.grad is None for m in low.masters)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        g = torch.randn(low.numel, generator=gen).bfloat16()
        low.grad.copy_(g)
        ref.grad.copy_(g.float())
        assert torch.equal(low.sq_norm(), ref.sq_norm())
        low.update(factor), ref.update(factor)
        assert for_gpu or not (low.grad.any() or ref.grad.any())  # a GPU's: lazily
    for a, b in zip(low.masters, ref.masters):
        assert torch.equal(a, b)
        made, own = low.optimizer.state[a], ref.optimizer.state[b]  # AdamW's own first step's
        assert made.keys() == own.keys() == {"exp_avg", "exp_avg_sq", "step"}
        for key in own:
            assert torch.equal(made[key], own[key]) and made[key].dtype == own[key].dtype
    assert not torch.equal(low.masters[0], _unit(torch.float32).masters[0])  # it moved


def test_a_cpu_runs_folds_into_a_bf16_accumulation_are_the_fp32_adds_rounded():
    """On a CPU each backward's bf16 gradient is added to the bf16 accumulation as it is:
    bit for bit the fp32 sum rounded to bf16 at each fold."""
    cfg = RunConfig(model=get_preset("tiny"))
    block = build_units(cfg.model, 0, [1])[0]
    state = UnitState(list(block.parameters()),
                      lambda ps, decay=None: make_optimizer(ps, cfg.train),
                      Replicated(torch.device("cpu"), torch.bfloat16), view_dtype=torch.bfloat16)
    state.prefetch()
    state.wait_view()
    want = torch.zeros(state.numel, dtype=torch.bfloat16)
    for seed in range(3):
        torch.manual_seed(seed)
        block(torch.randn(2, 8, 256, dtype=torch.bfloat16)).float().square().mean().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in state.params])
        want = (want.float() + grads.float()).bfloat16()
        state.fold_grads()
    assert state.grad.dtype == torch.bfloat16 and torch.equal(state.grad, want)
    assert want.float().abs().sum() > 0


def test_a_skipped_step_from_a_bf16_accumulation_leaves_masters_moments_and_count(monkeypatch):
    """found_inf = 1 on the chunked path: every chunk's fused AdamW skips, the step counter
    stays where it was (each chunk steps from the same count), the gradient is zeroed; the
    next step is the fp32 unit's, bit for bit."""
    monkeypatch.setattr(host_grad, "CHUNK", 448)
    low, ref = _unit(torch.bfloat16), _unit(torch.float32)
    g = torch.randn(low.numel, generator=torch.Generator().manual_seed(2)).bfloat16()
    for state in (low, ref):
        state.grad.copy_(g)
        state.update(0.5)
    before = [(m.clone(), {k: v.clone() for k, v in low.optimizer.state[m].items()})
              for m in low.masters]
    low.grad.copy_(g)
    low.update(0.5, found_inf=torch.tensor(1.0))
    assert not low.grad.any()
    for m, (was, state) in zip(low.masters, before):
        assert torch.equal(m, was)
        assert all(torch.equal(low.optimizer.state[m][k], v) for k, v in state.items())
    for state in (low, ref):
        state.grad.copy_(g)
        state.update(0.5)
    for a, b in zip(low.masters, ref.masters):
        assert torch.equal(a, b) and torch.equal(low.optimizer.state[a]["step"],
                                                 ref.optimizer.state[b]["step"])
        assert low.optimizer.state[a]["step"].item() == 2


def test_the_plan_field_round_trips_and_what_it_cannot_mean_is_refused():
    plan = build_plan(2, 1, 1, 2, view_window=1, state_home="host", host_grad_dtype="bfloat16")
    again = PipelinePlan.from_dict(plan.to_dict())
    assert again.host_grad_dtype == "bfloat16" and again == plan
    assert "host_grad_dtype" not in build_plan(2, 1, 1, 2).to_dict()  # older readers: as before
    for kw, words in [({"state_home": "device", "view_window": 1}, "--state-home host"),
                      ({"state_home": "host"}, "--view-window"),
                      ({"state_home": "host", "view_window": 1, "host_grad_dtype": "fp8"},
                       "unknown host gradient dtype")]:
        kw = {"host_grad_dtype": "bfloat16", **kw}
        with pytest.raises(ScheduleConfigError, match=words):
            build_plan(2, 1, 1, 2, **kw)


def test_the_flag_without_host_state_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--host-grad-dtype", "bfloat16",
                           "--steps", "1")
    assert code == 2 and "--host-grad-dtype bfloat16" in err and "--state-home host" in err
    assert len(err.strip().splitlines()) == 1


def test_on_a_cpu_in_float32_the_refusal_says_there_are_no_views(monkeypatch, capsys):
    """Both flags given, and still no views: a float32 CPU run computes on its masters."""
    code, _, err = run_cli(monkeypatch, capsys, "train", "--host-grad-dtype", "bfloat16",
                           "--state-home", "host", "--view-window", "1", "--dtype", "float32",
                           "--steps", "1")
    assert code == 2 and "--dtype other than float32" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("group", [1, 2])
def test_the_executors_ledger_is_the_simulators_with_a_bf16_host_gradient(group, monkeypatch):
    """On the GPU's fold path (run here on the CPU): half the host-homed units' gradient
    bytes, plus the update's fp32 scratch of the largest parameter, as the simulator holds."""
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    cfg = RunConfig(model=small_model())
    cfg.train.seq_len, cfg.train.global_batch, cfg.train.micro_batch_size = 64, 8, 2
    plans = {dtype: build_plan(2, 1, 1, 4, activation="recompute", view_window=1,
                               state_home="host", micro_batch_group=group, update="carried",
                               host_grad_dtype=dtype) for dtype in ("float32", "bfloat16")}
    measured = {dtype: executor_ledger(cfg, plan, set()) for dtype, plan in plans.items()}
    assert_simulated_ledger_is(measured["bfloat16"], plans["bfloat16"], cfg)
    n = sum(uc.param_count(cfg.model, u) for u in range(4))
    largest = max(s for kind in ("embedding", "block", "head")
                  for s in uc.param_sizes(cfg.model, kind))
    fewer = measured["float32"]["gradients"] - measured["bfloat16"]["gradients"]
    assert abs(fewer - (2 * n - 4 * largest)) <= 4 * 512  # arena alignment


def test_the_simulator_halves_the_folds_copies_and_adds_the_updates_cast():
    model, profile = get_preset("llama2-7b"), load_profile(GPU)

    def run(dtype):
        plan = build_plan(model.n_layers, 1, 1, 4, activation="recompute", view_window=1,
                          state_home="host", micro_batch_group=4, update="carried",
                          host_grad_dtype=dtype)
        return simulate(plan, model, profile, micro_batch_size=4, seq_len=4096,
                        dtype="bfloat16").ranks[0]

    fp32, bf16 = run("float32"), run("bfloat16")
    n = sum(uc.param_count(model, u) for u in range(model.n_layers + 2))
    scratch = 4 * host_grad.CHUNK  # the embedding's 131M elements, a chunk at a time
    assert fp32.host_peak - bf16.host_peak == pytest.approx(2 * n - scratch, rel=1e-3)
    assert bf16.device_peak == fp32.device_peak


def test_under_a_host_budget_the_planner_finds_the_batch_16_plan_with_a_bf16_gradient():
    """llama2-7b, batch 16 on the H200 profile, 20 GB of GPU and 100 GB of host state: with
    fp32 host gradients the best plan keeps 3 units on the device in groups of 4; bf16 ones
    leave room for more, and it is faster."""
    model, profile = get_preset("llama2-7b"), load_profile(GPU)
    profile = dataclasses.replace(profile, device=dataclasses.replace(
        profile.device, host_memory_bytes=111.2e9))

    def best(dtype):
        found = search(PlanRequest(model=model, profile=profile, devices=1, global_batch=16,
                                   seq_len=4096, dtype="bfloat16", budget=20e9,
                                   host_grad_dtype=dtype, time_limit_s=60))
        return found.best[0]

    fp32, bf16 = best("float32"), best("bfloat16")
    assert bf16.plan.host_grad_dtype == "bfloat16" and fp32.plan.host_grad_dtype == "float32"
    assert bf16.step_time < fp32.step_time
    assert bf16.host_bytes[0] <= profile.device.host_memory_bytes


def test_where_only_a_bf16_host_gradient_fits_the_account_says_so(monkeypatch, capsys):
    """llama2-7b at batch 16 with 90 GB of host tier (100 GB less the margin): no fp32 plan
    fits, and the account names the flag that would."""
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "llama2-7b", "--profile", GPU,
                           "--devices", "1", "--global-batch", "16", "--seq-len", "4096",
                           "--dtype", "bfloat16", "--memory-budget", "20GB",
                           "--host-memory-budget", "100GB")
    assert code == 2 and "--host-grad-dtype bfloat16 would fit" in err
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--model", "llama2-7b", "--profile", GPU,
                           "--devices", "1", "--global-batch", "16", "--seq-len", "4096",
                           "--dtype", "bfloat16", "--memory-budget", "20GB",
                           "--host-memory-budget", "100GB", "--host-grad-dtype", "bfloat16")
    assert code == 0 and "bf16 grad" in out.splitlines()[4]


def test_a_flag_that_contradicts_the_plan_files_is_refused(monkeypatch, capsys, tmp_path):
    cfg = RunConfig()
    plan = build_plan(cfg.model.n_layers, 1, 1, cfg.n_micro, view_window=1, state_home="host",
                      host_grad_dtype="bfloat16")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(path),
                           "--host-grad-dtype", "float32", "--steps", "1")
    assert code == 2 and "--host-grad-dtype float32 differs from host_grad_dtype bfloat16" in err, err


def test_a_search_on_a_profile_without_a_host_tier_refuses_the_flag(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--profile", "cpu-local",
                           "--host-grad-dtype", "bfloat16", "--global-batch", "4")
    assert code == 2 and "profile cpu-local has no host tier" in err
    assert len(err.strip().splitlines()) == 1


def test_below_a_host_bounded_search_the_bf16_option_is_offered_and_written(
        monkeypatch, capsys, tmp_path):
    """The best fp32 plan held to 100 GB of host state predicts less than a bf16-gradient one:
    `ratrain plan` says what the option buys and writes its plan beside --out's."""
    out = tmp_path / "plan.json"
    args = ["plan", "--model", "llama2-7b", "--profile", GPU, "--devices", "1",
            "--global-batch", "16", "--seq-len", "4096", "--dtype", "bfloat16",
            "--memory-budget", "20GB", "--host-memory-budget", "111.2GB"]
    code, text, _ = run_cli(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0
    line = next(x for x in text.splitlines() if x.startswith("with --host-grad-dtype bfloat16"))
    option = json.loads(out.with_suffix(".bf16grad.json").read_text())
    plan = PipelinePlan.from_dict(option)
    plan.validate()
    assert plan.host_grad_dtype == "bfloat16"
    assert json.loads(out.read_text()).get("host_grad_dtype", "float32") == "float32"
    tokens = option["prediction"]["tokens_per_s"]
    assert f"{tokens:,.0f} tokens/s" in line
    # 4 micro-batches in unit-major groups of 2: each unit's two runs fold, each rounds
    assert (plan.n_micro, plan.micro_batch_group) == (4, 2) and "each of 2 folds a step" in line
    assert tokens > 1.02 * json.loads(out.read_text())["prediction"]["tokens_per_s"]
    code, text, _ = run_cli(monkeypatch, capsys, *args, "--json")
    assert json.loads(text)["host_grad_option"]["tokens_per_s"] == pytest.approx(tokens)
    # asked for already: no option below it
    code, text, _ = run_cli(monkeypatch, capsys, *args, "--host-grad-dtype", "bfloat16")
    assert code == 0 and "with --host-grad-dtype" not in text


def test_train_searching_under_a_host_bound_says_what_a_bf16_gradient_would_buy(
        monkeypatch, capsys, tmp_path):
    """`ratrain train --memory-budget` (its own search) names the option `ratrain plan` offers,
    and takes the fp32 plan; here the machine's memory then refuses the 7B run."""
    import ratrain.training.prepare

    monkeypatch.setattr(ratrain.training.prepare, "available_host_bytes", lambda: 8 * 10**9)
    search = ["--model", "llama2-7b", "--profile", GPU, "--devices", "1", "--global-batch", "16",
              "--seq-len", "4096", "--dtype", "bfloat16", "--memory-budget", "20GB",
              "--host-memory-budget", "111.2GB"]
    code, text, _ = run_cli(monkeypatch, capsys, "plan", *search, "--json")
    planned = json.loads(text)
    code, _, err = run_cli(monkeypatch, capsys, "train", *search, "--steps", "1", "--run-dir",
                           str(tmp_path / "run"), "--no-progress")
    assert code == 2 and "does not fit this machine's memory" in err
    first, offered = err.splitlines()[:2]
    assert f"{planned['plans'][0]['tokens_per_s']:,.0f} tokens/s" in first
    assert offered.startswith("not taken, since it rounds the gradients")
    assert f"{planned['host_grad_option']['tokens_per_s']:,.0f} tokens/s" in offered
    assert "x the plan above" in offered and "bf16 grad" in offered
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("available, devices, held", [
    (120e9, 2, 60e9), (1000e9, 1, 200e9), (None, 1, 200e9)])
def test_a_gpu_machines_search_holds_the_host_tier_to_its_memory(monkeypatch, available,
                                                                   devices, held):
    """Without --profile, `ratrain train --memory-budget` on GPUs searches the host memory
    the run will be checked against, shared by the GPUs, not the preset's node (200 GB a GPU);
    a CPU profile, whose host is the device, is left as it is."""
    import ratrain.host_memory
    from ratrain.cli.plan_search import with_this_machines_host

    monkeypatch.setattr(ratrain.host_memory, "available_host_bytes", lambda: available)
    hw = with_this_machines_host(load_profile("h100-80g-ib"), devices)
    assert hw.device.host_memory_bytes == held
    assert ("shared by the" in hw.notes["device.host_memory_bytes"]) == (available is not None)
    cpu = load_profile("cpu-local")
    assert with_this_machines_host(cpu, devices) == cpu


def test_where_the_options_search_finds_none_in_its_time_plan_1s_layout_is_priced(monkeypatch):
    """The option's own search stops at its limit with no plan (a 70B search's first comes
    after half a minute): plan 1's layout with bf16 gradients is simulated instead, and offered
    where faster. baichuan2-13b on 8 A100s of the preset, 64 sequences: 32 micro-batches of 2
    fold across PCIe, half the bytes in bf16."""
    from ratrain.planner import host_grad_option

    found = search(PlanRequest(model=get_preset("baichuan2-13b"),
                               profile=load_profile("a100-40g-10gbe"), devices=8, global_batch=64,
                               seq_len=4096, dtype="bfloat16", time_limit_s=60, top=1))
    best = found.best[0]
    assert best.plan.state_home == "host"
    monkeypatch.setattr(host_grad_option, "TIME_LIMIT_S", 1e-9)  # no plan by then
    option = host_grad_option.offer(found)
    assert option is not None and option.plan.host_grad_dtype == "bfloat16"
    same = ("pp", "dp", "micro_batch_size", "n_micro", "schedule", "weight_grad")
    assert all(getattr(option.layout, k) == getattr(best.layout, k) for k in same)
    assert option.step_time * host_grad_option.FASTER <= best.step_time
