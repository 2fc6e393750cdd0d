"""The files `ratrain plan --out` (and `train --memory-budget`) write: every one made on a YAML
profile names it, none overwrites what is not a plan, an earlier search's option file does not
outlive it, and --threads is run as the plan was predicted on."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ratrain.cli.plan_taken import other_machine_note
from ratrain.config import RunConfig
from ratrain.sim.profile import load_profile

from .cli_runner import run_cli, small_config
from .test_low_comm import _text, two_nodes


def _yaml(tmp_path, profile, name: str):
    """`profile` saved as tmp_path/NAME.yaml under NAME: a profile no preset is."""
    path = tmp_path / f"{name}.yaml"
    dataclasses.replace(profile, name=name).save(path)
    return path


def _simulated(monkeypatch, capsys, plan) -> dict:
    code, stdout, stderr = run_cli(monkeypatch, capsys, "simulate", "--plan", str(plan), "--json")
    assert code == 0, stderr
    return json.loads(stdout)


def test_every_plan_file_made_on_a_yaml_profile_names_its_file(monkeypatch, capsys, tmp_path):
    """The option files beside --out and RUN/plan.json once had the profile's name alone:
    `simulate --plan` refused them ("not a preset") and train's note of a GPU's plan was lost."""
    slow = _yaml(tmp_path, two_nodes(100), "slow")
    out = tmp_path / "slow.json"
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                           str(slow), "--devices", "2", "--memory-budget", "200MB", "--pp", "1",
                           "--out", str(out))
    assert code == 0, err
    for plan in (out, tmp_path / "slow.diloco.json"):
        assert json.loads(plan.read_text())["prediction"]["profile_file"] == str(slow.resolve())
        assert _simulated(monkeypatch, capsys, plan)["profile"] == "slow"
    gpu = _yaml(tmp_path, load_profile("h100-80g-ib"), "my-gpu")
    out = tmp_path / "gpu.json"
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile", str(gpu),
                           "--devices", "2", "--memory-budget", "30MB", "--top", "1", "--out",
                           str(out))
    assert code == 0, err
    option = json.loads(out.with_suffix(".bf16grad.json").read_text())
    assert option["prediction"]["profile_file"] == str(gpu.resolve())
    simulated = _simulated(monkeypatch, capsys, out.with_suffix(".bf16grad.json"))
    assert simulated["step_time_s"] == pytest.approx(option["prediction"]["step_time_s"])
    note = other_machine_note(option, "gpu.bf16grad.json", RunConfig())
    assert note and "made on profile my-gpu (NVIDIA H100" in note and "a GPU" in note
    measured = _yaml(tmp_path, load_profile("cpu-local"), "measured")
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config",
                           str(small_config(tmp_path, steps=1)), "--memory-budget", "3MB",
                           "--devices", "2", "--profile", str(measured), "--run-dir", str(run),
                           "--no-progress", "--no-report", "--no-checkpoints")
    assert code == 0, err
    ran = json.loads((run / "plan.json").read_text())
    assert ran["prediction"]["profile_file"] == str(measured.resolve())
    assert _simulated(monkeypatch, capsys, run / "plan.json")["profile"] == "measured"


def test_out_refuses_the_profile_and_what_is_not_a_plan(monkeypatch, capsys, tmp_path):
    """`plan --out` once overwrote anything: the --profile YAML it had just read (a measured
    profile, which may need a GPU's machine to remake) became a plan."""
    monkeypatch.chdir(tmp_path)
    profile = _yaml(tmp_path, load_profile("cpu-local"), "mine")
    before = profile.read_bytes()
    search = ("plan", "--model", "tiny", "--devices", "2", "--memory-budget", "200MB", "--top",
              "1")
    (tmp_path / "notes.txt").write_text("precious data")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "p.diloco.json").write_text("not a plan")
    (tmp_path / "mine.bf16grad.json").write_bytes(before)  # a profile named as an option file
    profiles = "--out {} is the --profile file: give the plan another name"
    kept = "exists and is not a ratrain plan, which it would overwrite: move it, or give " \
           "another --out"
    for out, spec, said in [
            (str(profile), "mine.yaml", profiles.format(profile)),
            ("./mine.yaml", "mine.yaml", profiles.format("./mine.yaml")),
            ("mine.json", "mine.bf16grad.json", profiles.format(
                "mine.json's option file mine.bf16grad.json")),
            ("notes.txt", "mine.yaml", f"--out notes.txt {kept}"),
            ("list.json", "mine.yaml", f"--out list.json {kept}"),
            ("p.json", "mine.yaml", f"--out p.json's option file p.diloco.json {kept}")]:
        code, stdout, err = run_cli(monkeypatch, capsys, *search, "--profile", spec, "--out", out)
        assert code == 2 and stdout == "" and err == f"error: {said}\n", err
    assert profile.read_bytes() == before
    assert (tmp_path / "notes.txt").read_text() == "precious data"
    assert (tmp_path / "p.diloco.json").read_text() == "not a plan"
    # an older plan (here a flag-built one) is the search's to overwrite
    assert run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--out", "old.json")[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, *search, "--profile", "mine.yaml", "--out",
                           "old.json")
    assert code == 0, err
    assert json.loads((tmp_path / "old.json").read_text())["prediction"]["profile"] == "mine"


def test_an_earlier_searchs_option_files_are_removed(monkeypatch, capsys, tmp_path):
    """Re-run where no option is offered, `plan --out FILE` left FILE.diloco.json of the
    earlier search, and `train --plan` of it trained that search's option."""
    slow = _yaml(tmp_path, two_nodes(100), "slow")
    out = tmp_path / "plan.json"
    common = ("plan", "--model", "tiny", "--devices", "2", "--memory-budget", "200MB", "--pp", "1")
    code, _, err = run_cli(monkeypatch, capsys, *common, "--profile", str(slow), "--out", str(out))
    assert code == 0, err
    option = out.with_suffix(".diloco.json")
    assert option.is_file()
    out.with_suffix(".bf16grad.json").write_text(out.read_text())  # an earlier one's, too
    code, stdout, err = run_cli(monkeypatch, capsys, *common, "--profile", "cpu-local", "--out",
                                str(out))
    assert code == 0, err
    assert not option.exists() and not out.with_suffix(".bf16grad.json").exists()
    assert stdout.splitlines()[-1] == (
        f"removed {option}, {out.with_suffix('.bf16grad.json')}: an earlier search's option for "
        f"--out {out}, which this one does not offer")
    code, _, err = run_cli(monkeypatch, capsys, *common, "--profile", str(slow), "--out", str(out))
    assert code == 0 and option.is_file(), err
    code, stdout, err = run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--out", str(out),
                                "--json")  # no search: no option; stdout stays the object
    assert code == 0 and not option.exists() and json.loads(stdout)["pp"] == 2
    assert err == f"removed {option}: an earlier search's option for --out {out}, which this " \
                  "one does not offer\n"


def test_a_plan_made_with_threads_runs_on_them(monkeypatch, capsys, tmp_path):
    """`plan --threads 1` recorded its threads in the prediction alone: `simulate --plan` of the
    same file predicted twice its speed (cpu-local's 2 threads) and `train --plan` ran on 2."""
    out = tmp_path / "t1.json"
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                           "cpu-local", "--devices", "1", "--memory-budget", "200MB",
                           "--threads", "1", "--top", "1", "--out", str(out))
    assert code == 0, err
    plan = json.loads(out.read_text())
    assert plan["run"]["parallel"]["threads_per_rank"] == 1
    simulated = _simulated(monkeypatch, capsys, out)
    assert simulated["threads_per_rank"] == 1
    assert simulated["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"])
    for command in ("simulate", "train"):
        code, _, err = run_cli(monkeypatch, capsys, command, "--plan", str(out), "--threads", "2",
                               "--no-progress" if command == "train" else "--json")
        assert code == 2 and err == (f"error: --threads 2 differs from 1, which {out} was made "
                                     "for; leave the flag out or make a new plan\n"), err
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(out), "--steps", "1",
                           "--data", str(_text(tmp_path)), "--eval-batches", "0", "--run-dir",
                           str(run), "--no-progress", "--no-report", "--no-checkpoints")
    assert code == 0, err
    assert RunConfig.load(run / "config.yaml").parallel.threads_per_rank == 1
    del plan["run"]["parallel"]["threads_per_rank"]  # without --threads: none, train's rule
    out.write_text(json.dumps(plan))
    assert _simulated(monkeypatch, capsys, out)["threads_per_rank"] == 2
