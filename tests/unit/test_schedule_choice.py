"""`--schedule auto`: the schedule a run takes is the fastest simulated candidate that fits,
of those predicted alike the one that holds least (1F1B unless a split schedule is clearly
faster), and the choice is written into the config."""

import dataclasses

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.setup import check_memory_fits, run_plan
from ratrain.setup.choice import MARGIN, choose, default_profile
from ratrain.sim.profile import load_profile

from .cli_runner import run_cli


def _cfg(pp: int, dp: int, n_micro: int) -> RunConfig:
    cfg = RunConfig(model=get_preset("small"))
    cfg.train.seq_len, cfg.train.micro_batch_size = 256, 2
    cfg.train.global_batch = 2 * dp * n_micro
    cfg.parallel.pp, cfg.parallel.dp = pp, dp
    return cfg


def _choose(cfg, budget=None):
    return choose(cfg, run_plan, load_profile("cpu-local"), budget)


def test_the_fastest_candidate_that_fits_is_chosen():
    choice = _choose(_cfg(2, 1, 4))
    by_label = {c.label: c for c in choice.candidates}
    assert set(by_label) == {"1f1b", "zbh1 bubble", "zbh1 bubble:0", "zbh1 grouped"}
    fastest = min(choice.candidates, key=lambda c: c.step_s)
    assert fastest.step_s < by_label["1f1b"].step_s * (1 - MARGIN)  # the case worth choosing
    # of the candidates predicted alike (within the margin of the fastest), the one that
    # holds least: here ZB-H1 in the bubble, not grouped, which keeps every micro-batch
    alike = [c for c in choice.candidates if c.step_s * (1 - MARGIN) < fastest.step_s]
    chosen = min(alike, key=lambda c: c.peak_bytes)
    assert (choice.schedule, choice.weight_grad) == (chosen.schedule, chosen.weight_grad)
    assert (choice.schedule, choice.weight_grad) == ("zbh1", "bubble")
    assert by_label["zbh1 grouped"].peak_bytes > by_label["zbh1 bubble"].peak_bytes
    # a budget under ZB-H1's last stage: the capped placement, which holds about 1F1B's
    capped = by_label["zbh1 bubble:0"]
    assert capped.peak_bytes < by_label["zbh1 bubble"].peak_bytes
    assert capped.step_s < by_label["1f1b"].step_s * (1 - MARGIN)
    mid = _choose(_cfg(2, 1, 4), capped.peak_bytes)
    assert (mid.schedule, mid.weight_grad) == ("zbh1", "bubble:0")
    # a budget only 1F1B fits leaves it the one
    budget = by_label["1f1b"].peak_bytes
    assert any(c.peak_bytes > budget for c in choice.candidates)
    tight = _choose(_cfg(2, 1, 4), budget)
    chosen = next(c for c in tight.candidates
                  if (c.schedule, c.weight_grad) == (tight.schedule, tight.weight_grad))
    assert chosen.peak_bytes <= budget

def test_a_tie_keeps_1f1b():
    choice = _choose(_cfg(1, 2, 2))
    by_label = {c.label: c for c in choice.candidates}
    assert abs(by_label["zbh1 grouped"].step_s / by_label["1f1b"].step_s - 1) < MARGIN
    assert (choice.schedule, choice.weight_grad) == ("1f1b", None)


def test_the_choice_is_written_into_the_config_and_a_given_schedule_is_kept():
    cfg = _cfg(2, 1, 4)
    said = []
    plan = run_plan(cfg, say=said.append)
    choice = _choose(_cfg(2, 1, 4))
    assert (cfg.parallel.schedule, cfg.parallel.weight_grad) == (choice.schedule, choice.weight_grad)
    assert (plan.schedule, plan.weight_grad) == (choice.schedule, choice.weight_grad)
    assert said == [choice.why]
    run_plan(cfg, say=said.append)
    assert len(said) == 1  # given now: nothing chosen, nothing said
    one = _cfg(1, 1, 2)
    run_plan(one, say=said.append)
    assert len(said) == 1  # nothing to choose between
    assert one.parallel.schedule == "1f1b"


def test_a_gpu_without_a_profile_is_simulated_on_its_familys_preset():
    assert default_profile(None) == "cpu-local"
    assert default_profile("NVIDIA A100-SXM4-40GB") == "a100-40g-10gbe"
    assert default_profile("NVIDIA H200") == "h100-80g-ib"


def test_simulate_says_what_it_chose(monkeypatch, capsys):
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--model", "small", "--pp", "2",
                                   "--seq-len", "256", "--global-batch", "8",
                                   "--micro-batch-size", "2")
    assert code == 0, stderr
    first = stdout.splitlines()[0]
    assert first.startswith("schedule zbh1") and "1f1b" in first and "--schedule overrides" in first


def test_simulate_prices_the_threads_train_would_give_the_ranks(monkeypatch, capsys):
    """`ratrain simulate` predicts the run `ratrain train` makes with the same flags on the
    profile's machine: one process on every core of a CPU profile (cpu-local's 2), launched
    ranks on one thread each, else --threads."""
    import json

    def simulated(*flags):
        code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--model", "small",
                                       "--seq-len", "128", "--global-batch", "8",
                                       "--micro-batch-size", "2", "--json", *flags)
        assert code == 0, stderr
        summary = json.loads(stdout)
        return summary["threads_per_rank"], summary["step_time_s"]

    (every, on_every), (one, on_one) = simulated(), simulated("--threads", "1")
    assert (every, one) == (2, 1) and on_every < 0.7 * on_one
    assert simulated("--pp", "2")[0] == 1 and simulated("--pp", "2", "--threads", "2")[0] == 2
    assert simulated("--profile", "h100-80g-ib")[0] == 1  # a GPU's ranks: no cores shared


def test_a_group_whose_host_bytes_the_machine_lacks_is_not_chosen():
    """Unit-major groups hold g micro-batches' offloaded activations in host memory: --schedule
    auto weighs each candidate's bytes against the memory the machine has, not the device's
    alone, so a run it chooses is not then refused by the memory check."""
    from ratrain.setup import Machine
    from ratrain.setup.memory_fit import stage_bytes

    def cfg():
        c = _cfg(1, 1, 4)
        c.train.dtype = "bfloat16"
        c.parallel.state_home, c.parallel.view_window, c.parallel.activation = "host", 1, "offload"
        return c

    gpu = Machine(host_is_separate=True, memory_bytes=80 * 2**30)
    host = {}
    for g in (1, 2, 4):
        c = cfg()
        c.parallel.schedule, c.parallel.micro_batch_group = "1f1b", g
        host[g] = stage_bytes(c, run_plan(c, gpu), load_profile(gpu.preset))[0].host
    assert host[1] < host[2] < host[4]
    roomy = cfg()
    run_plan(roomy, gpu)
    assert roomy.parallel.micro_batch_group == 4  # predicted fastest where the host holds it
    for available, group in (((host[2] + host[4]) // 2, 2), ((host[1] + host[2]) // 2, 1)):
        c, said = cfg(), []
        machine = dataclasses.replace(gpu, host_available_bytes=available)
        plan = run_plan(c, machine, say=said.append)
        assert (c.parallel.micro_batch_group, plan.micro_batch_group) == (group, group)
        assert "1f1b in groups of 4 " in said[0] and "(does not fit)" in said[0]
        check_memory_fits(c, plan, machine)  # the choice passes the run's own check


def test_on_a_cpu_the_choice_weighs_the_machines_memory_not_the_presets():
    """On a CPU the device is the host: a machine with the memory for 7B's stages chooses among
    them by speed, rather than holding every stage to the cpu-local preset's 8 GB, which none
    fits (the least memory, 1F1B, was taken then)."""
    from ratrain.setup import Machine

    def cfg():
        c = RunConfig(model=get_preset("llama2-7b"))
        c.train.seq_len, c.train.micro_batch_size, c.train.global_batch = 256, 1, 4
        c.parallel.pp = 2
        return c

    preset, said = cfg(), []
    run_plan(preset, Machine(), say=said.append)
    assert preset.parallel.schedule == "1f1b" and "least memory of none that fit" in said[0]
    roomy, said = cfg(), []
    run_plan(roomy, Machine(host_available_bytes=400 * 2**30), say=said.append)
    fastest = choose(cfg(), run_plan, load_profile("cpu-local"), budget=float("inf"))
    assert (roomy.parallel.schedule, roomy.parallel.weight_grad) == (fastest.schedule,
                                                                     fastest.weight_grad)
    assert roomy.parallel.schedule != "1f1b" and "214.75 GB budget, fits" in said[0]  # 200 GiB


def test_the_candidates_are_simulated_on_the_ranks_threads():
    """A single process on a CPU computes on every core (torch's default): --schedule auto
    simulates its candidates on the threads the machine says its ranks have."""
    from ratrain.setup import Machine

    def said(threads):
        c = _cfg(1, 1, 4)
        c.train.dtype = "bfloat16"  # views: unit-major groups are candidates
        lines = []
        run_plan(c, Machine(host_available_bytes=64 * 2**30, threads_per_rank=threads),
                 say=lines.append)
        return float(lines[0].split("simulated ")[1].split(" s/step")[0])

    assert said(2) < 0.7 * said(1)


def test_a_stage_is_held_to_the_budget_with_the_process_as_simulates_table_holds_it(
        monkeypatch, capsys, tmp_path):
    """A profile of 95 MiB that some candidates' device peaks fit but not with the process's
    own 38 MiB: --schedule auto said "fits" above a table of NO (it weighed the device peak
    alone) and took ZB-H1."""
    from ratrain.sim.simulator import simulate

    cpu = load_profile("cpu-local")
    small = dataclasses.replace(cpu, device=dataclasses.replace(
        cpu.device, memory_bytes=1e8, process_overhead_bytes=4e7))
    yaml = tmp_path / "small.yaml"
    small.save(yaml)

    def tiny(schedule="auto", weight_grad=None):
        c = RunConfig(model=get_preset("tiny"))
        c.train.seq_len, c.train.micro_batch_size, c.train.global_batch = 256, 2, 8
        c.parallel.pp, c.parallel.schedule, c.parallel.weight_grad = 2, schedule, weight_grad
        return c

    choice = choose(tiny(), run_plan, small, threads_per_rank=1)
    alone_fits = 0
    for c in choice.candidates:
        trial = tiny(c.schedule, c.weight_grad)
        result = simulate(run_plan(trial), trial.model, small, micro_batch_size=2, seq_len=256,
                          dtype="float32", threads_per_rank=1)
        with_process = [r.device_peak + small.device.process_overhead(r.ledger_growth)
                        for r in result.ranks]
        assert c.peak_bytes == pytest.approx(max(with_process))
        alone_fits += max(r.device_peak for r in result.ranks) <= 1e8 < max(with_process)
    assert alone_fits  # the case: a device peak that fits alone, not with the process
    assert "least memory of none that fit" in choice.why and ", fits." not in choice.why
    assert choice.schedule == "1f1b"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--profile", str(yaml),
                                   "--pp", "2", "--threads", "1", "--model", "tiny")
    assert code == 0, stderr
    lines = stdout.splitlines()
    stages = [line for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert len(stages) == 2 and any(" NO " in line for line in stages)
    assert lines[0].startswith("schedule 1f1b:") and ", fits." not in lines[0]


def test_a_reason_every_schedule_shares_is_said_once(monkeypatch, capsys):
    code, _, stderr = run_cli(monkeypatch, capsys, "simulate", "--partition", "0,6", "--pp", "2",
                              "--threads", "1")
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert stderr.count("every stage needs at least one unit") == 1


def test_a_group_beside_a_weight_gradient_placement_says_why_neither_runs():
    """--micro-batch-group keeps 1F1B only and --weight-grad zbh1 only: the choice had no
    candidate left and said "no schedule can run this layout: " with no reason."""
    cfg = _cfg(2, 1, 4)
    cfg.parallel.micro_batch_group, cfg.parallel.weight_grad = 2, "grouped"
    with pytest.raises(UserError, match=r"--micro-batch-group 2 runs 1F1B over groups, and "
                       r"--weight-grad grouped places .* give one of them$"):
        _choose(cfg)


def test_a_cpu_with_bf16_instructions_prices_bf16_as_fp32(tmp_path):
    """cpu-local's AVX2 cores train bf16 15x slower than fp32; cores with AVX-512 BF16 or AMX
    trained it at 0.8-1.7x fp32's tokens/s, where the preset predicted 17 tokens/s for `small`
    (670-1,750 measured): the machine's flag decides, read from /proc/cpuinfo."""
    from ratrain.cpu_features import bf16_matmul_flag
    from ratrain.setup import Machine
    from ratrain.sim.simulator import simulate

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    assert bf16_matmul_flag(info) == "avx512_bf16"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512_bf16 amx_bf16\n")
    assert bf16_matmul_flag(info) == "amx_bf16"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert bf16_matmul_flag(info) is None
    assert bf16_matmul_flag(tmp_path / "none") is None

    cfg = _cfg(2, 1, 4)
    cfg.train.dtype = "bfloat16"
    plan = run_plan(cfg)
    amx_machine = Machine(cpu_bf16_flag="amx_bf16")
    avx2, amx = Machine().preset_profile("bfloat16"), amx_machine.preset_profile("bfloat16")
    assert amx_machine.preset_profile("float32") == load_profile("cpu-local")
    assert avx2.device.compute["bfloat16"].efficiency < 0.1
    assert amx.device.compute["bfloat16"] == amx.device.compute["float32"]
    assert "amx_bf16" in amx.name
    slow, fast = (simulate(plan, cfg.model, p, micro_batch_size=2, seq_len=256,
                           dtype="bfloat16").step_time for p in (avx2, amx))
    assert fast < slow / 5
    # a GPU's host has nothing to say of the devices' rates
    gpu = Machine(host_is_separate=True, device_name="NVIDIA H200", cpu_bf16_flag="amx_bf16")
    assert gpu.preset_profile("bfloat16") == load_profile("h100-80g-ib")
