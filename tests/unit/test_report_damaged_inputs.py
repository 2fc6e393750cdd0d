"""`ratrain report` of a run directory whose files parse but hold what no run writes (edited
by hand, or damaged): a metrics.jsonl row of a wrong-typed value or without its loss is
refused in one line naming the file, the line and the key; a plan.json, or the --plan file it
fell back to, not of a plan's shape (setup/plan_file_shape.py) is read as one that could not
be read: a note, the report written without it. Both once ended in a traceback, or drew the
value as it was. The run directory is written here, as `ratrain train` writes it."""

from __future__ import annotations

import json

import pytest

from ratrain.config import RunConfig
from ratrain.report import write_report
from ratrain.report.run import load_run
from ratrain.schedule.plan import build_plan
from ratrain.training.metrics import MetricsDamaged

from .cli_runner import run_cli


def _row(step: int) -> dict:
    return {"step": step, "loss": 6.0 - 0.1 * step, "tokens_per_s": 1000.0,
            "step_time_s": 2.0, "peak_memory_bytes": 4e8 + step, "mfu": 0.1,
            "rss_growth_bytes_per_rank": [9e7, 8e7]}


def _run_dir(tmp_path, rows=None, plan_file: str | None = None):
    """A pp=2 run stopped after 4 steps (no summary.json, no trace.json), with its plan.json."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = RunConfig()
    cfg.parallel.pp, cfg.train.steps = 2, 8
    cfg.parallel.plan_file = plan_file
    cfg.save(run / "config.yaml")
    n_micro = cfg.train.global_batch // cfg.train.micro_batch_size
    (run / "plan.json").write_text(json.dumps(build_plan(cfg.model.n_layers, 2, 1,
                                                         n_micro).to_dict()))
    rows = rows or [_row(s) for s in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _edit_plan(run, **values) -> None:
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps({**plan, **values}))


@pytest.mark.parametrize("key, value, said", [
    ("loss", "abc", "its loss is 'abc', not a number"),
    ("tokens_per_s", [1], "its tokens_per_s is [1], not a number"),
    ("step_time_s", "2s", "its step_time_s is '2s', not a number"),
    ("mfu", "x", "its mfu is 'x', not a number"),
    ("val_loss", {"a": 1}, "its val_loss is {'a': 1}, not a number"),
    ("rss_growth_bytes_per_rank", [9e7, "x"], "its rss_growth_bytes_per_rank holds 'x', not a "
                                              "number"),
    ("loss_per_replica", 5.0, "its loss_per_replica is 5.0, not a list")])
@pytest.mark.parametrize("line", [3, 4])  # 4: the last, which read_metrics leaves out if cut short
def test_a_metrics_row_of_a_wrong_typed_value_is_named_with_its_line_and_key(tmp_path, key,
                                                                             value, said, line):
    rows = [_row(s) for s in range(1, 5)]
    # line 2's nulls are what MetricsLog writes of floats that are not finite: read as such
    rows[1].update(loss=None, val_loss=None, loss_per_replica=[5.0, None])
    rows[line - 1][key] = value
    run = _run_dir(tmp_path, rows)
    with pytest.raises(MetricsDamaged) as raised:
        load_run(run)
    assert str(raised.value) == (f"{run / 'metrics.jsonl'} is damaged: line {line}: {said}; "
                                 "correct or remove that line")


def test_a_metrics_row_whose_step_is_true_is_not_a_row(tmp_path):
    """true is an int to Python: it was read as step 1."""
    rows = [_row(s) for s in range(1, 5)]
    rows[1]["step"] = True
    run = _run_dir(tmp_path, rows)
    with pytest.raises(MetricsDamaged, match=r"metrics\.jsonl is damaged: line 2 is not a row"):
        load_run(run)


def test_a_metrics_row_without_its_loss_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    rows = [_row(s) for s in range(1, 5)]
    del rows[2]["loss"]
    run = _run_dir(tmp_path, rows)
    code, _, err = run_cli(monkeypatch, capsys, "report", str(run))
    assert code == 2
    assert err.strip() == (f"error: {run / 'metrics.jsonl'} is damaged: line 3: it has no "
                           "loss; correct or remove that line")


@pytest.mark.parametrize("values, raw, said", [
    ({"pp": "two"}, None, '"pp" must be a positive integer, got "two"'),
    ({"activation": 5}, None, '"activation" must be a string, or a list of each stage\'s list '
                              'of strings, got 5'),
    ({"programs": None}, None, '"programs" must be a list, got null'),
    ({"pp": 1}, None, "plan.json is inconsistent: its pp is 1, but its stage_units has 2 "
                      "stages (edited by hand?)"),
    ({"prediction": {"budget_bytes": "1GB"}}, None,
     "its prediction.budget_bytes is '1GB', not a number"),
    ({}, "3", "it holds int, not an object")])
def test_a_plan_json_not_of_a_plans_shape_is_a_note(monkeypatch, capsys, tmp_path, values, raw,
                                                    said):
    run = _run_dir(tmp_path)
    _edit_plan(run, **values)
    if raw is not None:
        (run / "plan.json").write_text(raw)
    written = write_report(run, profile="cpu-local")
    assert written.page.is_file()
    assert f"no simulated step: plan.json could not be read ({said})" in written.notes
    assert dict(written.table)["layout"] == (f"pp=2 x dp=1 (pp-dp) by config.yaml; plan.json "
                                             f"could not be read ({said})")
    code, out, _ = run_cli(monkeypatch, capsys, "report", str(run), "--profile", "cpu-local")
    assert code == 0
    assert f"note: no simulated step: plan.json could not be read ({said})" in out


def test_a_plan_file_not_of_a_plans_shape_gives_no_budget(tmp_path):
    given = tmp_path / "plan.json"
    run = _run_dir(tmp_path, plan_file=str(given))
    # the run's copy without a prediction (before 2026-11-27): the report reads the --plan file
    given.write_text(json.dumps({**json.loads((run / "plan.json").read_text()),
                                 "prediction": [1e9]}))
    written = write_report(run)
    assert (f'the plan file {given} could not be read ("prediction" must be an object, got '
            "[1000000000.0]): no budget, no planner's prediction") in written.notes
    assert load_run(run).plan is not None  # the run's own plan.json is whole
