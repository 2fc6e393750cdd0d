"""`ratrain plan` and `ratrain simulate` refuse the shared flags only training reads
(cli/options.refuse_training_flags): until 2026-12-04 `plan --steps 3 --lr 7 --out p.json`
exited 0 and `train --plan p.json` trained 300 steps at the default lr."""

from __future__ import annotations

import json

import pytest

from .cli_runner import run_cli

SEARCH = ("plan", "--model", "tiny", "--profile", "cpu-local", "--devices", "2",
          "--memory-budget", "60MB", "--seq-len", "32", "--global-batch", "4", "--top", "1")
PLAN_FILE_SAYS = ("a plan file holds the layout, memory policies, model and batch it was made "
                  "for, not the training's other settings; give them to `ratrain train --plan "
                  "FILE`")


def _one_error(monkeypatch, capsys, *args: str) -> str:
    code, out, err = run_cli(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and not out, (out, err)
    return lines[0]


def test_a_search_refuses_the_training_flags_in_one_line_and_writes_nothing(
        monkeypatch, capsys, tmp_path):
    out = tmp_path / "p2.json"
    line = _one_error(monkeypatch, capsys, *SEARCH, "--steps", "3", "--lr", "7", "--data",
                      "/nonexistent", "--checkpoint-every", "5", "--out", str(out))
    # (--steps is the search's: it bounds the --sync diloco option's period)
    assert line == ("error: `ratrain plan` does not use --data /nonexistent, --lr 7, "
                    f"--checkpoint-every 5: {PLAN_FILE_SAYS}")
    assert not out.exists()


# (what training alone reads; --grad-clip and the shape flags change the plan)
TRAINING_ONLY = ("data", "tokenizer", "steps", "seed", "lr", "warmup_steps", "eval_every",
                 "eval_batches", "val_fraction", "checkpoint_every")


@pytest.mark.parametrize("key", TRAINING_ONLY)
def test_plan_without_a_search_refuses_each_training_flag(monkeypatch, capsys, key):
    flag = "--" + key.replace("_", "-")
    value = {"data": "texts", "tokenizer": "byte", "val_fraction": "0.1"}.get(key, "3")
    line = _one_error(monkeypatch, capsys, "plan", "--pp", "2", flag, value)
    assert line == (f"error: `ratrain plan` does not use {flag} {value}: "
                    + PLAN_FILE_SAYS.replace("give them", "give it"))


def test_a_searchs_steps_are_said_in_the_command_that_runs_its_plan(monkeypatch, capsys,
                                                                    tmp_path):
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(monkeypatch, capsys, *SEARCH, "--steps", "3", "--grad-clip",
                                "0", "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}: run it with `ratrain train --plan {out} --steps 3`" in stdout
    # --grad-clip 0 is the plan's: its programs take no global norm
    assert json.loads(out.read_text())["clip"] is False


def test_simulate_refuses_the_training_flags_and_takes_the_steps_shape(monkeypatch, capsys):
    line = _one_error(monkeypatch, capsys, "simulate", "--pp", "2", "--steps", "3", "--seed",
                      "1", "--warmup-steps", "0")
    assert line == ("error: `ratrain simulate` does not use --steps 3, --seed 1, --warmup-steps "
                    "0: it predicts one step from the model, batch and layout alone; leave "
                    "them out")
    code, stdout, err = run_cli(monkeypatch, capsys, "simulate", "--pp", "2", "--seq-len", "32",
                                "--global-batch", "4", "--grad-clip", "0")
    assert code == 0, err
    assert "2 micro-batches of 2 x 32 tokens" in stdout
