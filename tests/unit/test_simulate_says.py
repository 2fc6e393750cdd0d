"""What `ratrain simulate` says beside its prediction, in text and in JSON alike: that the
profile was measured beside other work, the --schedule auto choice, and the plan's budget."""

import dataclasses
import json

import pytest

from ratrain.sim.profile import load_profile

from .cli_runner import run_cli

BUSY = ("other work kept 1.42 cores busy during the measuring: the times are slower than on a "
        "quiet machine")


def _profile(tmp_path, **notes):
    cpu = load_profile("cpu-local")
    path = tmp_path / "measured.yaml"
    dataclasses.replace(cpu, name="measured", notes={**cpu.notes, **notes}).save(path)
    return str(path)


def test_a_profile_measured_beside_other_work_is_said_on_the_command_line(
        monkeypatch, capsys, tmp_path):
    """The note was in the YAML alone: predictions twice too slow came without a word."""
    busy = _profile(tmp_path, other_work=BUSY)
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--profile", busy,
                                   "--model", "tiny", "--threads", "1")
    assert code == 0, stderr
    said = [line for line in stdout.splitlines() if "other work" in line]
    assert said == [f"profile measured: {BUSY}"]
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--profile", busy,
                                   "--model", "tiny", "--threads", "1", "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["profile_other_work"] == f"profile measured: {BUSY}"
    quiet = str(tmp_path / "quiet.yaml")
    load_profile("cpu-local").save(quiet)
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--profile", quiet,
                                   "--model", "tiny", "--threads", "1")
    assert code == 0 and "other work" not in stdout, stderr


def test_plan_says_it_too(monkeypatch, capsys, tmp_path):
    busy = _profile(tmp_path, other_work=BUSY)
    search = ("plan", "--profile", busy, "--model", "tiny", "--devices", "2", "--memory-budget",
              "200MB", "--threads", "1")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *search)
    assert code == 0, stderr
    assert [line for line in stdout.splitlines() if "other work" in line] == [
        f"profile measured: {BUSY}"]
    code, stdout, stderr = run_cli(monkeypatch, capsys, *search, "--json")
    assert code == 0 and json.loads(stdout)["profile_other_work"] == f"profile measured: {BUSY}"


def test_the_json_has_the_choice_the_text_starts_with(monkeypatch, capsys):
    flags = ("simulate", "--model", "tiny", "--pp", "2", "--threads", "1")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *flags)
    assert code == 0, stderr
    first = stdout.splitlines()[0]
    assert first.startswith("schedule ")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *flags, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["schedule_choice"] == first
    code, stdout, stderr = run_cli(monkeypatch, capsys, *flags, "--schedule", "1f1b", "--json")
    assert code == 0 and json.loads(stdout)["schedule_choice"] is None, stderr


def test_a_plans_json_names_the_plans_budget_not_the_profiles_memory(
        monkeypatch, capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--profile", "cpu-local",
                              "--devices", "2", "--memory-budget", "50MB", "--out", str(out))
    assert code == 0, stderr
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(out), "--json")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["memory_budget_bytes"] == pytest.approx(50e6)
    assert got["device_limit_bytes"] == pytest.approx(45e6)
