"""What a new user met: an output path that cannot be written, a corpus file named as the
tokenizer's --out, --devices 0 (each one line on stderr, exit code 2); `simulate --plan` on
another profile than the plan's; a schedule line that said "fits" over the host tier."""

from __future__ import annotations

import json

import pytest

from .cli_runner import run_cli

TINY = ("--model", "tiny", "--seq-len", "32", "--global-batch", "8")


@pytest.mark.parametrize("args, said", [
    (("plan", *TINY, "--memory-budget", "50MB", "--out", "{tmp}/no/dir/p.json"),
     "error: --out {tmp}/no/dir/p.json: cannot write the plan there (No such file or directory)"),
    (("simulate", *TINY, "--trace", "{tmp}"), "error: {tmp}: Is a directory"),
])
def test_an_output_path_that_cannot_be_written(monkeypatch, capsys, tmp_path, args, said):
    code, _, stderr = run_cli(monkeypatch, capsys, *(a.format(tmp=tmp_path) for a in args))
    assert code == 2
    assert stderr.strip() == said.format(tmp=tmp_path)


def test_the_tokenizer_refuses_to_overwrite_a_file_that_is_no_tokenizer(monkeypatch, capsys,
                                                                        tmp_path):
    corpus = tmp_path / "texts"
    corpus.mkdir()
    text = "def f(x):\n    return x + 1\n" * 50
    (corpus / "f1.txt").write_text(text)
    code, _, stderr = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(corpus),
                              "--vocab-size", "300", "--out", str(corpus / "f1.txt"))
    assert code == 2 and "refusing to overwrite it" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert (corpus / "f1.txt").read_text() == text
    out = tmp_path / "tok.json"
    for _ in range(2):  # a tokenizer.json is replaced by a new one
        code, _, stderr = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(corpus),
                                  "--vocab-size", "300", "--out", str(out))
        assert code == 0, stderr


@pytest.mark.parametrize("args", [
    ("plan", "--devices", "0"),
    ("plan", "--devices", "0", "--memory-budget", "50MB"),
    ("train", "--devices", "0", "--memory-budget", "50MB"),
])
def test_zero_devices_is_refused_as_below_one_is(monkeypatch, capsys, tmp_path, args):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, *TINY)
    assert code == 2 and stdout == ""
    assert stderr.strip() == "error: --devices must be at least 1, got 0"


def test_more_stages_than_devices_is_said_so(monkeypatch, capsys, tmp_path):
    """It was said as a host tier overfilled by one unit a stage (cpu-local has none)."""
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--memory-budget", "50MB", "--pp",
                              "3", *TINY)
    assert code == 2
    assert stderr.strip() == "error: --pp 3 needs a device a stage, 3 at least; the search has " \
                             "2 (--devices)"


def test_simulate_plan_takes_the_profile_the_plan_was_made_on(monkeypatch, capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                              "cpu-local", "--devices", "2", "--memory-budget", "60MB",
                              "--out", str(out))
    assert code == 0, stderr
    plan = json.loads(out.read_text())
    plan["prediction"]["profile"] = "mt3000"  # as if made there: the default must follow it
    out.write_text(json.dumps(plan))
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out))
    assert code == 0, stderr
    assert stdout.splitlines()[0] == f"profile mt3000: the one {out} was made on (--profile to change it)"
    assert stdout.splitlines()[1].startswith("tiny on mt3000:")
    plan["prediction"]["profile"] = "measured-elsewhere"  # a YAML file's, not loadable by name
    out.write_text(json.dumps(plan))
    code, _, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out))
    assert code == 2 and "give its YAML file as --profile" in stderr
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out),
                                   "--profile", "cpu-local")
    assert code == 0 and stdout.startswith("tiny on cpu-local:"), stderr


def test_simulate_plan_finds_the_yaml_profile_the_plan_was_made_on(monkeypatch, capsys, tmp_path):
    """A measured profile is a YAML file: the plan file records its path, and simulate
    reproduces the plan's prediction on it (it predicted cpu-local's until 2026-11-29)."""
    import dataclasses

    from ratrain.sim.profile import load_profile

    yaml = tmp_path / "box.yaml"
    dataclasses.replace(load_profile("a100-40g-10gbe"), name="box").save(yaml)
    out = tmp_path / "plan.json"
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                              str(yaml), "--devices", "2", "--memory-budget", "2GB",
                              "--out", str(out))
    assert code == 0, stderr
    made = json.loads(out.read_text())["prediction"]
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out), "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["profile"] == "box" and made["profile_file"] == str(yaml.resolve())
    assert got["step_time_s"] == pytest.approx(made["step_time_s"], rel=1e-9)


def test_simulate_plan_judges_the_plan_by_its_budget_as_plan_did(monkeypatch, capsys, tmp_path):
    """simulate --plan of a plan made for 50 MB said it "fits 11.8 GiB" (the profile's memory)
    and showed the ledger alone; now the stage's peak with the process against the plan's
    budget less its margin, as `ratrain plan` held it. plan --json names device units."""
    out = tmp_path / "plan.json"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--profile", "cpu-local",
                                   "--devices", "2", "--memory-budget", "50MB", "--out", str(out),
                                   "--json")
    assert code == 0, stderr
    planned = json.loads(stdout)["plans"][0]
    assert planned["device_units"] == [] and planned["host_grad_dtype"] == "float32"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out), "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["device_limit_bytes"] == pytest.approx(45e6)
    for stage, peak in zip(got["stages"], planned["stage_peak_bytes"]):
        assert stage["peak_with_process_bytes"] == pytest.approx(peak, rel=1e-9)
        assert stage["fits_device"]


def test_a_runs_report_simulates_on_the_yaml_profile_its_plan_was_made_on(tmp_path):
    """`ratrain report` (and the report at a run's end) takes the profile as simulate --plan
    does: it read the plan's profile name only, so a measured profile was "not a file, and not
    one of the presets"; a moved YAML still leaves the name."""
    from types import SimpleNamespace

    from ratrain.report.run import profile_spec

    yaml = tmp_path / "box.yaml"
    yaml.write_text("description: a measured box\n")
    plan = {"prediction": {"profile": "box", "profile_file": str(yaml)}}
    run = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(profile=None)), plan_file=plan)
    assert profile_spec(run, None) == str(yaml)
    assert profile_spec(run, "cpu-local") == "cpu-local"
    yaml.unlink()
    assert profile_spec(run, None) == "box"


# (README's example until 2026-11-29: every stage's host tier over its 3.7 GiB)
HOST_OVER = ("simulate", "--model", "llama2-7b", "--profile", "mt3000", "--pp", "8", "--dp",
                   "128", "--seq-len", "4096", "--global-batch", "1024", "--micro-batch-size", "1",
                   "--dtype", "float16", "--activation", "recompute", "--state-home", "host",
                   "--view-window", "1")


def test_a_host_tier_over_its_bytes_is_no_fit_in_the_schedule_line_or_the_json(monkeypatch,
                                                                                capsys):
    code, stdout, stderr = run_cli(monkeypatch, capsys, *HOST_OVER)
    assert code == 0, stderr
    assert "GB host tier, fits the device but not the host tier, as no candidate does." \
        in stdout.splitlines()[0]
    code, stdout, _ = run_cli(monkeypatch, capsys, *HOST_OVER, "--json")
    stages = json.loads(stdout)["stages"]
    assert all(s["fits_device"] and s["fits_host"] is False for s in stages)
