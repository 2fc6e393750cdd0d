"""`ratrain plan` as a search: its table, its plan file, and one clear account when nothing
fits."""

from __future__ import annotations

import json

import pytest

from .cli_runner import run_cli

SEARCH = ("plan", "--model", "tiny", "--profile", "cpu-local", "--devices", "2")


def test_the_search_lists_the_fastest_plans_and_writes_the_best(monkeypatch, capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--memory-budget", "60MB",
                                   "--top", "2", "--out", str(out))
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("tiny on cpu-local: 8 x 256 tokens per step")
    assert "budget 60.00 MB per device" in lines[0]
    rows = [line for line in lines if line[:2] in ("1 ", "2 ")]
    assert len(rows) == 2
    plan = json.loads(out.read_text())
    assert plan["run"]["model"]["name"] == "tiny"
    assert plan["run"]["parallel"]["pp"] * plan["run"]["parallel"]["dp"] <= 2
    assert max(plan["prediction"]["stage_peak_bytes"]) <= 60e6 * 0.9


def test_json_gives_the_candidates(monkeypatch, capsys):
    code, stdout, _ = run_cli(monkeypatch, capsys, *SEARCH, "--json", "--top", "3")
    assert code == 0
    summary = json.loads(stdout)
    times = [p["step_time_s"] for p in summary["plans"]]
    assert len(times) == 3 and times == sorted(times)
    assert summary["complete"] is True


def test_nothing_fits_is_an_account_and_exit_2(monkeypatch, capsys):
    code, stdout, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--memory-budget", "20MB")
    assert code == 2 and stdout == ""
    assert stderr.startswith("error: no plan fits 20.00 MB per device")
    assert "closest: pp=" in stderr and "over (states" in stderr and "budget of" in stderr
    assert "Traceback" not in stderr


def test_a_budget_above_the_devices_memory_says_what_holds_the_plans(monkeypatch, capsys):
    """A cpu-local device has 8 GB: asked for 20 GB, the plans are held to 8, and the user is
    told (they once read "no plan fits 8.00 GB" after asking for 20 GB, with no why)."""
    said = "a cpu-local device has 8.00 GB, less than the 20.00 GB asked"
    code, stdout, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--memory-budget", "20GB")
    assert code == 0 and "budget 8.00 GB per device" in stdout
    assert stderr.startswith(f"note: the plans are held to the device's memory: {said}")
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "llama2-7b", "--profile",
                              "cpu-local", "--devices", "1", "--memory-budget", "20GB")
    assert code == 2
    assert stderr.startswith(f"error: no plan fits 8.00 GB per device (7.20 GB after the 10% "
                             f"margin; {said}")
    assert "`ratrain profile`" in stderr.splitlines()[0]
    code, _, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--memory-budget", "8GB")
    assert code == 0 and "note:" not in stderr


def test_a_search_cut_by_its_time_limit_before_any_plan_says_so(monkeypatch, capsys):
    """Not "no plan fits" (with a closest plan that fits): the search did not finish."""
    code, stdout, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--time-limit", "1e-9")
    assert code == 2 and stdout == ""
    assert stderr.startswith("error: the search found no plan that fits in ")
    assert "4x its --time-limit 1e-09 s (0 simulated;" in stderr
    assert "raise --time-limit" in stderr and "no plan fits" not in stderr


def test_a_budget_that_is_not_one(monkeypatch, capsys):
    code, _, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--memory-budget", "plenty")
    assert code == 2
    assert stderr.strip().splitlines() == [
        "error: --memory-budget: expected bytes such as 20GB, 18GiB or 20e9, got 'plenty'"]


@pytest.mark.parametrize("flag, value", [("--dp", "2"), ("--micro-batch-group", "2"),
                                         ("--update", "carried")])
def test_what_the_planner_chooses_is_not_a_flag_of_the_search(monkeypatch, capsys, flag, value):
    """--micro-batch-group and --update were taken and ignored: the plan file said neither."""
    code, _, stderr = run_cli(monkeypatch, capsys, *SEARCH, flag, value)
    assert code == 2 and f"{flag} is the planner's to choose" in stderr


def test_a_planned_run_refuses_a_flag_it_was_not_made_for(monkeypatch, capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert run_cli(monkeypatch, capsys, *SEARCH, "--out", str(out))[0] == 0
    code, _, stderr = run_cli(monkeypatch, capsys, "train", "--plan", str(out), "--seq-len", "128",
                              "--run-dir", str(tmp_path / "run"))
    assert code == 2
    assert "--seq-len 128 differs from 256" in stderr
    assert not (tmp_path / "run").exists()
    code, _, stderr = run_cli(monkeypatch, capsys, "train", "--plan", str(out), "--model",
                              "tiny-gqa", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and "was made for model tiny" in stderr


@pytest.mark.parametrize("flag, needle", [
    (("--activation", "recompute"), "chooses the activations unit by unit"),
    (("--device-units", "1"), "keeps no unit's state on the device"),
    (("--update", "carried"), "updates inline"),
    (("--sync", "diloco:2"), "does not fit this run: sync=step (run has diloco:2)"),
])
def test_a_planned_run_refuses_a_flag_its_programs_decide(monkeypatch, capsys, tmp_path, flag,
                                                          needle):
    """Such a run used to go as the plan said while its config.yaml recorded the flag."""
    out = tmp_path / "plan.json"
    assert run_cli(monkeypatch, capsys, *SEARCH, "--out", str(out))[0] == 0
    code, _, stderr = run_cli(monkeypatch, capsys, "train", "--plan", str(out), *flag,
                              "--run-dir", str(tmp_path / "run"))
    assert code == 2 and needle in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "run").exists()


def test_a_sharded_plan_says_so_in_the_table_the_json_and_the_plan_file(monkeypatch, capsys, tmp_path):
    """The baseline's (ratrain's frees its gradients early here: the test below)."""
    out = tmp_path / "plan.json"
    args = ("plan", "--model", "tiny", "--profile", "mt3000", "--devices", "4", "--dtype",
            "float16", "--memory-budget", "42MB", "--micro-batch-size", "2", "--top", "1",
            "--policy", "baseline")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0, stderr
    row = next(line for line in stdout.splitlines() if line.startswith("1 "))
    assert "2 x 2" in row and "device, sharded / resident" in row
    plan = json.loads(out.read_text())
    assert plan["shard_state"] is True and plan["dp"] == 2
    assert plan["run"]["parallel"]["shard_state"] is True
    assert "grad_lifetime" not in plan and plan["run"]["parallel"]["grad_lifetime"] == "step"
    code, stdout, _ = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0 and json.loads(stdout)["plans"][0]["shard_state"] is True
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out), "--profile",
                                   "mt3000", "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["shard_state"] is True
    assert got["step_time_s"] == plan["prediction"]["step_time_s"]


def test_a_split_schedule_shows_its_halves_and_placement(monkeypatch, capsys):
    args = ("plan", "--model", "tiny", "--pp", "1", "--global-batch", "4",
            "--micro-batch-size", "2", "--schedule", "zbh1")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--weight-grad", "bubble")
    assert code == 0, stderr
    assert stdout.startswith("ratrain zbh1 (weight gradients: bubble), pp=1")
    assert "BI1.0" in stdout and "BW1.1" in stdout and "B1.0 " not in stdout
    # grouped on one stage: unit-major, whole backwards (nothing waits for the input's half)
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--weight-grad", "grouped")
    assert code == 0, stderr
    assert stdout.startswith("ratrain zbh1 (weight gradients: grouped), pp=1")
    assert "B1.0" in stdout and "BI1.0" not in stdout and "BW1.1" not in stdout
    code, stdout, _ = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0
    plan = json.loads(stdout)
    assert (plan["schedule"], plan["weight_grad"]) == ("zbh1", "bubble")
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--schedule", "1f1b",
                              "--weight-grad", "bubble")
    assert code == 2 and "--weight-grad places the weight gradients of a split backward" in stderr
    # a placement without a schedule: the split schedule is implied
    code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--weight-grad",
                                   "grouped", "--json")
    assert code == 0, stderr
    assert (json.loads(stdout)["schedule"], json.loads(stdout)["weight_grad"]) == ("zbh1", "grouped")


def test_the_search_weighs_split_schedules_on_multi_process_layouts(monkeypatch, capsys):
    code, stdout, stderr = run_cli(monkeypatch, capsys, *SEARCH, "--json", "--top", "200")
    assert code == 0, stderr
    plans = json.loads(stdout)["plans"]
    split = {(p["pp"], p["dp"], p["weight_grad"]) for p in plans if p["schedule"] == "zbh1"}
    assert (2, 1, "bubble") in split and (1, 2, "grouped") in split
    code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--pp", "2",
                                   "--global-batch", "4", "--micro-batch-size", "2",
                                   "--schedule", "zbh1")
    assert code == 0, stderr



def test_a_shorter_gradient_lifetime_in_the_table_the_plan_file_and_the_run(monkeypatch, capsys,
                                                                          tmp_path):
    """tiny in fp32 on 2 devices as one stage under 52 MB: no plan whose full-size gradients
    live the step fits; the search's plan frees them early. The table says which lifetime, the
    plan file carries it (the plan's and run.parallel's), `simulate --plan` predicts what the
    search did, and `train --plan` prepares the run with it."""
    import shutil
    from sysconfig import get_paths

    from ratrain.training import run as train

    out = tmp_path / "plan.json"
    args = ("plan", "--model", "tiny", "--profile", "cpu-local", "--devices", "2", "--pp", "1",
            "--seq-len", "64", "--memory-budget", "52MB", "--top", "1")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0, stderr
    row = next(line for line in stdout.splitlines() if line.startswith("1 "))
    plan = json.loads(out.read_text())
    lifetime = plan["grad_lifetime"]
    assert lifetime in ("transient", "micro-batch")
    assert f"device, sharded, grad {lifetime} / window 1" in row
    assert plan["run"]["parallel"]["grad_lifetime"] == lifetime
    assert plan["shard_state"] is True and plan["dp"] == 2
    assert max(plan["prediction"]["stage_peak_bytes"]) <= 52e6 * 0.9
    code, stdout, _ = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0 and json.loads(stdout)["plans"][0]["grad_lifetime"] == lifetime
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out),
                                   "--profile", "cpu-local", "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["grad_lifetime"] == lifetime
    assert got["step_time_s"] == plan["prediction"]["step_time_s"]
    # --grad-lifetime restricts the search: with today's (the step's) nothing fits
    code, _, stderr = run_cli(monkeypatch, capsys, *args, "--grad-lifetime", "step")
    assert code == 2 and "error: no plan fits" in stderr, stderr
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--grad-lifetime", lifetime)
    assert code == 0 and f"grad {lifetime} / window 1" in stdout, stderr
    code, _, stderr = run_cli(monkeypatch, capsys, *args, "--grad-lifetime", "transient",
                              "--policy", "baseline")
    assert code == 2 and "--grad-lifetime transient needs --policy ratrain" in stderr, stderr

    data = tmp_path / "text"
    data.mkdir()
    shutil.copy(f"{get_paths()['stdlib']}/textwrap.py", data)
    launched = []  # (the ranks are not started: the 2-process run is tests/distributed's)
    monkeypatch.setattr(train, "launch_local", lambda *a, **k: launched.append(a) or False)
    code, _, stderr = run_cli(monkeypatch, capsys, "train", "--plan", str(out), "--data",
                              str(data), "--steps", "1", "--no-progress", "--no-trace",
                              "--run-dir", str(tmp_path / "run"))
    assert code == 0, stderr
    world, _, (_, _, _, _, _, ranks_plan, _) = launched[0]  # (the last: the stream)
    assert world == 2 and ranks_plan["grad_lifetime"] == lifetime
    assert ranks_plan["programs"] == plan["programs"]
    assert f"grad_lifetime: {lifetime}" in (tmp_path / "run" / "config.yaml").read_text()


def test_the_search_prices_a_single_process_on_every_core(monkeypatch, capsys):
    """A layout of one rank on a CPU runs as one process on torch's default of every core
    (cpu-local's 2); the ranks training launches for the others take one thread each; else
    --threads. Each plan is simulated so, and says it."""
    def plans(devices, *flags):
        code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "small",
                                       "--profile", "cpu-local", "--devices", devices,
                                       "--seq-len", "128", "--global-batch", "8", "--top", "8",
                                       "--json", *flags)
        assert code == 0, stderr
        return {(p["pp"], p["dp"], p["micro_batch_size"], p["schedule"]): p
                for p in json.loads(stdout)["plans"]}

    assert {(k[0] * k[1] == 1, p["threads_per_rank"]) for k, p in plans("2").items()} == {
        (True, 2), (False, 1)}
    assert {p["threads_per_rank"] for p in plans("2", "--threads", "1").values()} == {1}
    every, one = plans("1"), plans("1", "--threads", "1")
    assert {p["threads_per_rank"] for p in every.values()} == {2}
    for key in set(every) & set(one):
        assert every[key]["step_time_s"] < 0.7 * one[key]["step_time_s"]
    code, stdout, _ = run_cli(monkeypatch, capsys, "plan", "--model", "small", "--profile",
                              "cpu-local", "--devices", "2", "--seq-len", "128",
                              "--global-batch", "8", "--top", "8")
    cells = {cell.strip() for line in stdout.splitlines() for cell in line.split("  ")}
    assert code == 0 and {"1 x 1, 2 threads", "2 x 1"} <= cells
    assert "the best plan runs one process on 2 threads: more processes" in stdout


def test_one_sequence_a_step_needs_no_micro_batch_flag(monkeypatch, capsys):
    """`--global-batch 1` (or one sequence per replica): the default micro-batch of 2 shrinks
    to the replica's share, for a plan of the flags and for a search, which picks its own;
    a --micro-batch-size that does not divide the batch is still refused."""
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--global-batch", "1")
    assert code == 0 and "n_micro=1" in out
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--global-batch", "4", "--dp", "4")
    assert code == 0 and "dp=4" in out and "n_micro=1" in out
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--profile", "cpu-local", "--devices",
                           "1", "--global-batch", "1", "--json")
    assert code == 0 and json.loads(out)["plans"][0]["micro_batch_size"] == 1
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--global-batch", "1",
                           "--micro-batch-size", "2")
    assert code == 2 and "--global-batch 1 (train.global_batch) is not a multiple of " \
        "--micro-batch-size 2 (train.micro_batch_size)" in err


def test_a_planned_run_resumes_with_its_own_plan_when_the_file_is_gone(monkeypatch, capsys,
                                                                       tmp_path):
    """The plan file was made in a scratch directory and is gone, or was planned anew: the run
    resumes with the plan it ran (RUN/plan.json; until 2026-11-27: "plan file not found"),
    and continues exactly as a run that never stopped."""
    from ratrain.training.metrics import read_metrics

    from .cli_runner import small_config

    config = str(small_config(tmp_path, steps=2, checkpoint_every=1))
    out = tmp_path / "plan.json"

    def planned(run: str, *flags: str) -> None:
        assert run_cli(monkeypatch, capsys, "plan", "--config", config, "--profile", "cpu-local",
                       "--devices", "2", "--out", str(out))[0] == 0
        code, _, err = run_cli(monkeypatch, capsys, "train", "--config", config, "--plan",
                               str(out), "--run-dir", str(tmp_path / run), "--no-progress",
                               "--no-report", *flags)
        assert code == 0, err

    planned("straight", "--steps", "3")
    planned("stopped")
    out.unlink()
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(tmp_path / "stopped"),
                           "--steps", "3", "--no-progress", "--no-report")
    assert code == 0, err
    got = [r["loss"] for r in read_metrics(tmp_path / "stopped" / "metrics.jsonl")]
    assert got == [r["loss"] for r in read_metrics(tmp_path / "straight" / "metrics.jsonl")]


@pytest.mark.parametrize("available_gb, held", [(64, None), (12, "6.00 GB")])
def test_train_with_a_memory_budget_on_a_cpu_holds_it_to_this_machines_memory(
        monkeypatch, capsys, tmp_path, available_gb, held):
    """On a CPU (no --profile) a device's memory is the machine's available memory shared by
    the devices searched, not the cpu-local preset's 8 GB: 20 GB a device is searched where
    2 devices have 64 GB, and held to 6 GB where they have 12."""
    import ratrain.host_memory
    from .cli_runner import small_config

    monkeypatch.setattr(ratrain.host_memory, "available_host_bytes",
                        lambda: available_gb * 10**9)
    config = str(small_config(tmp_path, steps=1, checkpoint_every=0))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", config, "--memory-budget",
                           "20GB", "--devices", "2", "--run-dir", str(tmp_path / "run"),
                           "--no-progress", "--no-report")
    assert code == 0, err
    if held is None:
        assert "note:" not in err and "--memory-budget 20.00 GB on cpu-local" in err
    else:
        assert f"a cpu-local device has {held}, less than the 20.00 GB asked" in err
        assert f"--memory-budget {held} on cpu-local" in err


@pytest.mark.parametrize("available_gb, budget", [(64, "20.00 GB"), (12, "6.00 GB")])
def test_plan_without_a_profile_searches_this_machines_memory_as_train_does(
        monkeypatch, capsys, available_gb, budget):
    """`ratrain plan --memory-budget 20GB` said nothing fits cpu-local's 8 GB on a machine where
    `ratrain train --memory-budget 20GB` found a plan: without --profile both now search the
    machine's available memory shared by the devices, and plan says so; --profile cpu-local
    keeps the preset's 8 GB."""
    import ratrain.host_memory

    monkeypatch.setattr(ratrain.host_memory, "available_host_bytes",
                        lambda: available_gb * 10**9)
    args = ("plan", "--model", "small", "--devices", "2", "--memory-budget", "20GB", "--top", "1")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args)
    assert code == 0, stderr
    assert f"budget {budget} per device" in stdout
    assert (f"a device's memory: this machine's available memory ({available_gb}.00 GB) shared "
            f"by the 2 devices searched") in stdout
    assert ("less than the 20.00 GB asked" in stderr) == (available_gb < 40)
    code, stdout, _ = run_cli(monkeypatch, capsys, *args, "--profile", "cpu-local")
    assert code == 0 and "budget 8.00 GB per device" in stdout
    assert "this machine's available memory" not in stdout


def test_train_with_a_memory_budget_searches_and_trains_the_plan_plan_would_write(
        monkeypatch, capsys, tmp_path):
    """`ratrain train --memory-budget B`: one command for "the fastest run that fits", the plan
    `ratrain plan` writes for the same request, recorded in RUN/plan.json with its prediction
    (what a resume and the report read)."""
    from .cli_runner import small_config

    config = str(small_config(tmp_path, steps=2, checkpoint_every=1))
    search = ("--config", config, "--memory-budget", "3MB", "--devices", "2")
    assert run_cli(monkeypatch, capsys, "plan", *search, "--out", str(tmp_path / "p.json"))[0] == 0
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", *search, "--run-dir", str(run),
                           "--no-progress", "--no-report")
    assert code == 0, err
    # (the warnings: a 3 MB budget holds the plan, not the test process's hundreds of MB)
    said = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert said[0].startswith("--memory-budget 3.00 MB on cpu-local: the fastest of "), err
    planned = json.loads((tmp_path / "p.json").read_text())
    ran = json.loads((run / "plan.json").read_text())
    assert {k: ran[k] for k in planned} == planned  # programs, layout, run settings, prediction
    assert ran["prediction"]["budget_bytes"] == 3e6 and ran["pp"] * ran["dp"] <= 2
    from ratrain.config import RunConfig

    assert RunConfig.load(run / "config.yaml").parallel.plan_file == str((run / "plan.json").resolve())
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run), "--steps", "3",
                           "--no-progress", "--no-report")
    assert code == 0, err


@pytest.mark.parametrize("flags, needle", [
    (("--memory-budget", "3MB", "--dp", "2"), "--dp is the planner's to choose"),
    (("--memory-budget", "3MB", "--plan", "p.json"), "--plan is one already"),
    (("--memory-budget", "3MB", "--resume", "run"), "a resumed run keeps the plan it ran"),
    (("--devices", "2",), "--devices goes with --memory-budget"),
    (("--host-memory-budget", "1GB",), "--host-memory-budget goes with --memory-budget"),
    (("--memory-budget", "3MB", "--host-memory-budget", "1GB"),
     "no host tier apart from its devices' memory"),
    (("--memory-budget", "1KB",), "a budget of"),  # nothing fits: the account of what is closest
])
def test_train_with_a_memory_budget_refuses(monkeypatch, capsys, tmp_path, flags, needle):
    from .cli_runner import small_config

    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           *flags, "--run-dir", str(tmp_path / "new"), "--no-progress")
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "new").exists()


def test_a_profile_without_host_memory_says_the_plans_host_memory_was_not_bounded(
        monkeypatch, capsys):
    """The 2026-11-26 H200 profile records none (`ratrain profile` did not on a GPU): its
    host-homed plans' host bytes went unbounded without a word. A preset that has it says
    nothing."""
    common = ("plan", "--model", "llama2-7b", "--devices", "1", "--global-batch", "16",
              "--seq-len", "4096", "--dtype", "bfloat16", "--memory-budget", "20GB", "--top", "1")
    code, out, err = run_cli(monkeypatch, capsys, *common, "--profile",
                             "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml")
    assert code == 0, err
    note = out.strip().splitlines()[-1]
    assert note.startswith("note: profile ") and "host memory was not bounded: " in note
    # GB: masters, gradients and AdamW of 6.74B parameters, less the embedding's, which plan 1
    # keeps on the device
    assert "plan 1 holds 105.7" in note
    code, out, err = run_cli(monkeypatch, capsys, *common, "--profile", "h100-80g-ib")
    assert code == 0 and "not bounded" not in out, err


def test_a_host_memory_budget_bounds_host_homed_state_and_says_so(monkeypatch, capsys,
                                                                   tmp_path):
    """--host-memory-budget sets the host tier the profile did not record (the 2026-11-26 H200
    profile): 7B's 107.8 GB of host-homed state then fits 111.2 GB (100.08 after the margin)
    only with units on the device, which the plan keeps, and no note says the host was
    unbounded. On a CPU profile, and given as no bytes, it is refused."""
    common = ("plan", "--model", "llama2-7b", "--devices", "1", "--global-batch", "16",
              "--seq-len", "4096", "--dtype", "bfloat16", "--memory-budget", "20GB", "--top", "1",
              "--profile", "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml")
    out_file = tmp_path / "plan.json"
    code, out, err = run_cli(monkeypatch, capsys, *common, "--host-memory-budget", "111.2GB",
                             "--out", str(out_file))
    assert code == 0, err
    assert "not bounded" not in out and "3 units on device" in out
    written = json.loads(out_file.read_text())
    prediction = written["prediction"]
    assert prediction["host_memory_bytes"] == 111.2e9
    assert max(prediction["stage_host_peak_bytes"]) <= 0.9 * 111.2e9
    assert written["device_units"] == [0, 1, 2]
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny",
                             "--host-memory-budget", "1GB")
    assert code == 2 and "no host tier apart from its devices' memory" in err
    code, out, err = run_cli(monkeypatch, capsys, *common, "--host-memory-budget", "lots")
    assert code == 2 and "--host-memory-budget: expected bytes" in err
