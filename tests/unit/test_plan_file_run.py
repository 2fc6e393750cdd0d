"""A plan file as `train --plan` and `simulate --plan` take it: the run it was made for, the
flags and hand edits that contradict it refused by name, a note where it was made for another
kind of machine; and `ratrain plan`'s --out and --json where they cannot give a plan."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from .cli_runner import run_cli

FAST = ("--threads", "1", "--seq-len", "32")
TRAIN = ("--steps", "1", "--no-report", "--no-checkpoints")


def _planned(monkeypatch, capsys, tmp_path, *flags: str) -> dict:
    code, _, err = run_cli(monkeypatch, capsys, "plan", *FAST, "--out", str(tmp_path / "p.json"),
                           *flags)
    assert code == 0, err
    return json.loads((tmp_path / "p.json").read_text())


def _edited(tmp_path, data: dict) -> str:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_shown_plans_file_runs_the_model_and_batch_it_was_made_for(monkeypatch, capsys,
                                                                     tmp_path):
    """Without a search --out wrote the plan alone: train --plan trained tiny, and refused its
    n_micro=8 (run has 4) naming no flag."""
    data = _planned(monkeypatch, capsys, tmp_path, "--model", "tiny-gqa", "--global-batch", "16")
    assert data["run"]["model"]["name"] == "tiny-gqa"
    assert data["run"]["train"]["global_batch"] == 16
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(tmp_path / "p.json"),
                           "--run-dir", str(tmp_path / "run"), "--no-progress", *TRAIN)
    assert code == 0, err
    ran = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert ran["model"]["name"] == "tiny-gqa" and ran["model"]["n_kv_heads"] == 2
    assert ran["train"]["global_batch"] == 16 and ran["train"]["seq_len"] == 32


def test_a_plans_model_renamed_alone_is_refused_naming_the_field(monkeypatch, capsys, tmp_path):
    data = _planned(monkeypatch, capsys, tmp_path, "--memory-budget", "2GB")
    assert data["model_preset"] == "tiny"
    data["run"]["model"]["name"] = "llama2-7b"
    for command in ("simulate", "train"):
        code, _, err = run_cli(monkeypatch, capsys, command, "--plan", _edited(tmp_path, data),
                               "--threads", "1")
        assert code == 2, err
        assert "was made for preset tiny, but run.model.name is llama2-7b" in err, err


@pytest.mark.parametrize("flag, value, said", [
    ("--pp", "3", "--pp 3 differs from pp 2, which"),
    ("--dp", "2", "--dp 2 differs from dp 1, which"),
    ("--rank-order", "dp-pp", "--rank-order dp-pp differs from rank_order pp-dp, which"),
    ("--partition", "2,4", "--partition 2,4 differs from 3,3, which")])  # (was: the plan's)
def test_a_layout_flag_that_differs_from_the_plan_is_refused_by_name(monkeypatch, capsys,
                                                                     tmp_path, flag, value, said):
    """--pp 3 got "--partition 3,3 gives 2 stages' units for 3 stages", a flag not given."""
    _planned(monkeypatch, capsys, tmp_path, "--pp", "2")
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--plan", str(tmp_path / "p.json"),
                           flag, value)
    assert code == 2
    assert said in err and "leave the flag out or make a new plan" in err, err


def test_a_plan_edited_to_another_pp_is_said_to_be_inconsistent(monkeypatch, capsys, tmp_path):
    data = _planned(monkeypatch, capsys, tmp_path, "--pp", "2")
    data["pp"] = 3
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--plan", _edited(tmp_path, data))
    assert code == 2
    assert "is inconsistent: its pp is 3, but its stage_units has 2 stages" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the note is for a CPU run of a GPU's plan")
def test_a_gpu_profiles_plan_trained_on_the_cpu_says_so_at_the_start(monkeypatch, capsys,
                                                                      tmp_path):
    _planned(monkeypatch, capsys, tmp_path, "--profile", "h100-80g-ib", "--memory-budget", "20GB")
    plan = str(tmp_path / "p.json")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", plan, "--run-dir",
                           str(tmp_path / "a"), *TRAIN)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "was made on profile h100-80g-ib" in line]
    assert len(notes) == 1, err
    assert "a GPU), and this run trains on the CPU" in notes[0]
    assert "memory budget (20.00 GB a device) are that machine's" in notes[0]
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", plan, "--run-dir",
                           str(tmp_path / "b"), "--no-progress", *TRAIN)
    assert code == 0, err
    assert "was made on profile" not in err


def test_simulate_on_a_smaller_device_than_the_plans_budget_says_what_it_holds_to(
        monkeypatch, capsys, tmp_path):
    """cpu-local's 8 GB less the margin was labelled "the plan's budget less 10%" of a plan
    made for 20 GB; without a plan simulate holds a stage to the device's whole memory."""
    _planned(monkeypatch, capsys, tmp_path, "--profile", "h100-80g-ib", "--memory-budget", "20GB")
    plan = str(tmp_path / "p.json")
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "--plan", plan, "--profile",
                             "cpu-local")
    assert code == 0, err
    assert "fits 8.00 GB (the profile's device memory; the plan's budget is 20.00 GB)" in out
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "--plan", plan, "--profile",
                             "cpu-local", "--json")
    assert code == 0, err
    assert json.loads(out)["device_limit_bytes"] == 8e9
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "--plan", plan, "--json")
    assert code == 0, err
    assert json.loads(out)["device_limit_bytes"] == pytest.approx(20e9 * 0.9)


def test_plan_json_when_nothing_fits_is_an_object_on_stdout(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", *FAST, "--memory-budget", "10MB",
                             "--json")
    assert code == 2
    said = json.loads(out)
    assert said["error"].startswith("no plan fits 10.00 MB per device")
    assert said["error"] in err
    assert said["closest"]["pp"] >= 1 and said["closest"]["estimated_excess_bytes"] > 0
    assert max(said["closest"]["stage_peak_bytes"]) > 10e6 * 0.9


@pytest.mark.parametrize("search", [(), ("--memory-budget", "2GB")])
def test_an_out_that_cannot_be_written_names_out(monkeypatch, capsys, tmp_path, search):
    code, _, err = run_cli(monkeypatch, capsys, "plan", *FAST, *search, "--out", str(tmp_path))
    assert code == 2
    assert f"error: --out {tmp_path} is a directory: give the plan's file name" in err, err
    blocked = tmp_path / "file"
    blocked.write_text("")
    code, _, err = run_cli(monkeypatch, capsys, "plan", *FAST, *search, "--out",
                           str(blocked / "plan.json"))
    assert code == 2
    assert f"error: --out {blocked / 'plan.json'}: cannot write the plan there" in err, err
