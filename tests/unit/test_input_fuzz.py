"""Damaged config and plan files, made by a seeded generator: the CLI's loaders answer each with
a run (the damage happened to be valid) or one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import random

import pytest
import yaml

from ratrain.config import RunConfig
from ratrain.schedule.plan import build_plan

from .cli_runner import run_cli

N_FILES = 120  # per loader: 240 files in all


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _values(rng: random.Random):
    return rng.choice([None, "fast", "", -1, 0, 0.5, 3, rng.randint(-3, 64), True, [1, "x"],
                       {"a": 1}, [], 1e-3, "3e-3", -0.5])


def _damage(data, rng: random.Random):
    """One random edit somewhere in nested plain data: delete, replace, or add a key."""
    if isinstance(data, dict) and data:
        key = rng.choice(list(data))
        roll = rng.random()
        if roll < 0.2:
            del data[key]
        elif roll < 0.3:
            data[rng.choice(["extra", "lr", "pp", "0"])] = _values(rng)
        elif roll < 0.7 and isinstance(data[key], (dict, list)):
            _damage(data[key], rng)
        else:
            data[key] = _values(rng)
    elif isinstance(data, list) and data:
        i = rng.randrange(len(data))
        if isinstance(data[i], (dict, list)) and rng.random() < 0.5:
            _damage(data[i], rng)
        elif isinstance(data[i], str) and rng.random() < 0.7:  # a program: garble an action
            tokens = data[i].split()
            j = rng.randrange(len(tokens))
            tokens[j] = rng.choice(["F9.9", "ZZ", "B1", "WRA2.7", "", "E", "F-1.0", tokens[0]])
            rng.shuffle(tokens) if rng.random() < 0.2 else None
            data[i] = " ".join(tokens)
        else:
            data[i] = _values(rng)


def _text(data, fmt: str, rng: random.Random) -> str:
    text = json.dumps(data) if fmt == "json" else yaml.safe_dump(data)
    roll = rng.random()
    if roll < 0.15:
        return text[:rng.randrange(len(text))]  # truncated
    if roll < 0.25:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice(["\x00", "}", ":", "\n- ", "\t"]) + text[i + 1:]
    return text


def _check(code: int, err: str) -> None:
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


def test_damaged_config_files(monkeypatch, capsys, tmp_path):
    rng = random.Random(1234)
    base = RunConfig().to_dict()
    refused = 0
    for i in range(N_FILES):
        data = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 3)):
            _damage(data, rng)
        fmt = rng.choice(["yaml", "json"])
        path = tmp_path / f"config{i}.{fmt}"
        path.write_text(_text(data, fmt, rng))
        code, _, err = run_cli(monkeypatch, capsys, "plan", "--config", str(path))
        _check(code, err)
        refused += code == 2
    assert refused > N_FILES // 2  # most damage is noticed


def test_damaged_plan_files(monkeypatch, capsys, tmp_path):
    rng = random.Random(4321)
    base = build_plan(4, 2, 1, 4, activation=["recompute", "keep"]).to_dict()
    refused = 0
    for i in range(N_FILES):
        data = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 2)):
            _damage(data, rng)
        path = tmp_path / f"plan{i}.json"
        path.write_text(_text(data, "json", rng))
        code, _, err = run_cli(monkeypatch, capsys, "simulate", "--plan", str(path))
        _check(code, err)
        refused += code == 2
    assert refused > N_FILES // 2
