"""What the command line says where its wording misled: the micro-batch hint "(the default: set
--micro-batch-size)" told to a user who had set it; `plan --json` that printed an object on
stdout for a search without a fit alone, nothing for any other refusal."""

from __future__ import annotations

import json

import pytest

from .cli_runner import run_cli

HINT = "(the default: set --micro-batch-size)"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _refused(monkeypatch, capsys, *args: str) -> tuple[str, str]:
    """(stdout, the one error line on stderr) of a refused command."""
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return out, lines[0].removeprefix("error: ")


@pytest.mark.parametrize("command", ["plan", "train"])
def test_the_micro_batch_hint_is_for_the_default_alone(monkeypatch, capsys, command):
    _, said = _refused(monkeypatch, capsys, command, "--global-batch", "7")
    assert said.endswith(f"train.micro_batch_size 2 {HINT}"), said
    _, said = _refused(monkeypatch, capsys, command, "--global-batch", "7",
                       "--micro-batch-size", "2")
    assert said == ("--global-batch 7 (train.global_batch) is not a multiple of "
                    "--micro-batch-size 2 (train.micro_batch_size)"), said


@pytest.mark.parametrize("args,error", [
    (["--model", "nosuch"], "unknown model preset 'nosuch'"),
    (["--profile", "missing.yaml"], "no hardware profile 'missing.yaml'"),
    (["--global-batch", "7"], "is not a multiple of train.micro_batch_size 2"),
])
def test_plan_json_prints_every_refusal_as_an_object(monkeypatch, capsys, args, error):
    out, said = _refused(monkeypatch, capsys, "plan", "--json", *args)
    assert error in said
    assert json.loads(out) == {"error": said}  # the no-fit object's key, the stderr message


def test_plan_json_prints_clicks_own_refusals_as_an_object(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--json", "--devices", "two")
    assert code == 2, err
    said = json.loads(out)["error"]
    assert "'--devices': 'two' is not a valid integer" in said and said in err
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--devices", "two")
    assert code == 2 and out == "", out  # without --json, stdout stays empty


def test_plan_json_without_a_fit_prints_one_object(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--json", "--memory-budget", "1KB")
    assert code == 2, err
    found = json.loads(out)  # one object: the no-fit one, not a second {"error"} after it
    assert err == f"error: {found['error']}\n"
    assert found["error"].startswith("no plan fits 1.0 kB per device")
    assert found["closest"]["estimated_excess_bytes"] > 0
