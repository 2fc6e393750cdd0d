"""A hand-edited plan file refused as it is read (setup/plan_file_shape.py): one line, exit 2,
naming the file and the key's path, where the readers' guesses once answered ("pp": "two" with
"--partition 3,3 gives 2 stages' units for 1 stages", a flag not given; "programs": null with
"TypeError: 'NoneType' object is not iterable"; a dp of 2 with "n_micro=2 (run has 1)")."""

from __future__ import annotations

import json

import pytest
import yaml

from .cli_runner import run_cli

MADE = ("--model", "tiny", "--seq-len", "32", "--global-batch", "4", "--micro-batch-size", "2",
        "--pp", "2", "--threads", "1")


@pytest.fixture
def plan(monkeypatch, capsys, tmp_path) -> dict:
    code, _, err = run_cli(monkeypatch, capsys, "plan", *MADE, "--out", str(tmp_path / "p.json"))
    assert code == 0, err
    return json.loads((tmp_path / "p.json").read_text())


def _edited(plan: dict, path: tuple, value=None, delete: bool = False) -> dict:
    data = json.loads(json.dumps(plan))
    *outer, last = path
    place = data
    for key in outer:
        place = place[key]
    if delete:
        del place[last]
    else:
        place[last] = value
    return data


def _train(monkeypatch, capsys, tmp_path, data: dict) -> tuple[int, str]:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(path), "--steps", "1",
                           "--no-report", "--no-progress", "--no-checkpoints", "--threads", "1",
                           "--run-dir", str(tmp_path / "run"))
    return code, err


@pytest.mark.parametrize("path, value, said", [
    (("pp",), "two", '"pp" must be a positive integer, got "two"'),
    (("programs",), None, '"programs" must be a list, got null'),
    (("programs",), {}, '"programs" must be a list, got {}'),
    (("n_micro",), "2", '"n_micro" must be a positive integer, got "2"'),
    (("pp",), -1, '"pp" must be a positive integer, got -1'),
    (("dp",), 0, '"dp" must be a positive integer, got 0'),
    (("pp",), True, '"pp" must be a positive integer, got true'),
    (("stage_units",), {}, '"stage_units" must be a list, got {}'),
    (("stage_units", 1), [3], '"stage_units[1]" must be a [start, stop] pair'),
    (("stage_units", 1), [4, 6], '"stage_units[1]" starts at unit 4, not at 3'),
    (("programs", 1), 7, '"programs[1]" must be a stage\'s program text (a string), got 7'),
    (("programs", 1), "F0.0 garbage", "programs[1]: not an action: 'garbage'"),
    (("clip",), "yes", '"clip" must be true or false, got "yes"'),
    (("view_window",), -1, '"view_window" must be null or a whole number (0 or more), got -1'),
    (("rank_order",), "xx", '"rank_order" must be one of pp-dp, dp-pp, got "xx"'),
    (("activation", 0), ["keep", 3], '"activation[0]" must be a list of strings'),
    (("run",), [], '"run" must be an object, got []'),
    (("run", "model"), [], '"run.model" must be an object, got []'),
    (("run", "train", "seq_len"), "32", '"run.train.seq_len" must be a positive integer, got "32"'),
    (("run", "train", "global_batch"), -4, '"run.train.global_batch" must be a positive integer'),
    (("run", "parallel", "partition"), [2, 4],
     '"run.parallel.partition" [2, 4] does not count the units of "stage_units"'),
    (("run", "parallel", "dp"), 2, '"run.parallel.dp" is 2, but "dp" is 1: the two must agree'),
    (("prediction",), [1], '"prediction" must be an object, got [1]'),
])
def test_a_value_of_the_wrong_type_or_sign_is_refused_naming_its_key(
        monkeypatch, capsys, tmp_path, plan, path, value, said):
    code, err = _train(monkeypatch, capsys, tmp_path, _edited(plan, path, value))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert str(tmp_path / "edited.json") in err and said in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path", [("pp",), ("programs",), ("activation",), ("clip",),
                                  ("run", "model"), ("run", "train"), ("run", "parallel"),
                                  ("run", "train", "micro_batch_size"), ("run", "model", "dim"),
                                  ("run", "parallel", "partition")])
def test_a_missing_key_at_each_level_is_named(monkeypatch, capsys, tmp_path, plan, path):
    code, err = _train(monkeypatch, capsys, tmp_path, _edited(plan, path, delete=True))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f'edited.json: "{".".join(path)}" is missing' in err, err


def test_a_dp_edited_alone_is_held_to_the_micro_batches(monkeypatch, capsys, tmp_path, plan):
    """The plan's programs run n_micro micro-batches a replica: dp x n_micro x micro-batch size
    is the global batch it was made for."""
    code, err = _train(monkeypatch, capsys, tmp_path, _edited(plan, ("dp",), 2))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert ('"dp" (2) x "n_micro" (2) x "run.train.micro_batch_size" (2) is 8 sequences a step, '
            'but "run.train.global_batch" is 4: they must agree') in err, err
    assert "n_micro=2 (run has 1)" not in err


def test_a_plan_without_run_settings_says_how_the_runs_micro_batches_come(monkeypatch, capsys,
                                                                         tmp_path, plan):
    """A plan of build_plan's kind (no "run") meets the run's flags: its n_micro refusal says
    which dp and batch made the run's."""
    data = _edited(_edited(plan, ("run",), delete=True), ("model_preset",), delete=True)
    data["dp"] = 2
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(data))
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--plan", str(path), *MADE[:-4])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert ("n_micro=2 (run has 1: --global-batch 4 / (dp 2 x --micro-batch-size 2))") in err, err


def test_an_unedited_plan_still_trains(monkeypatch, capsys, tmp_path, plan):
    code, err = _train(monkeypatch, capsys, tmp_path, plan)
    assert code == 0, err
    ran = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert ran["parallel"]["pp"] == 2 and ran["train"]["global_batch"] == 4
