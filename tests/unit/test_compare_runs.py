"""bench/compare_runs.py on real tiny runs: identical runs compare equal at their last step's
checkpoints; runs it cannot compare (a damaged last checkpoint, no checkpoints, another model,
no run there) are refused in one line, and validations are compared where both runs logged one."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from ratrain.cli import main as ratrain_main

from .bench_loader import load_bench
from .cli_runner import small_config

compare_runs = load_bench("compare_runs")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Four 2-step runs, trained once for the module (a few seconds each): `a` and `b` alike
    (validating every step), `c` validating only at the end, `d` without checkpoints, `e` of a
    narrower model."""
    tmp = tmp_path_factory.mktemp("runs")
    cfg = small_config(tmp, eval_every=1, eval_batches=1)
    narrow = yaml.safe_load(cfg.read_text())
    narrow["model"]["dim"] = 16
    (tmp / "narrow.yaml").write_text(yaml.safe_dump(narrow))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        for name, config, extra in [("a", cfg, []), ("b", cfg, []), ("c", cfg, ["--eval-every", "0"]),
                                    ("d", cfg, ["--no-checkpoints"]), ("e", tmp / "narrow.yaml", [])]:
            mp.setattr(sys, "argv", ["ratrain", "train", "--config", str(config), "--run-dir", name,
                                     "--no-progress", *extra])
            with pytest.raises(SystemExit) as done:
                ratrain_main()
            assert done.value.code == 0, name
    return tmp


def _refused(capsys, *runs: Path) -> str:
    code = compare_runs.main([str(r) for r in runs])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_identical_runs_compare_equal_at_their_last_steps_checkpoints(runs, capsys, tmp_path):
    out_file = tmp_path / "cmp.json"
    assert compare_runs.main([str(runs / "a"), str(runs / "b"), "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    for run in ("a", "b"):
        assert str(runs / run / "checkpoints" / "step_000002") in out
    assert f"wrote {out_file}" in out and "within tolerance" in out
    result = compare_runs.compare(runs / "a", runs / "b")
    assert result["max_rel_weight_diff"] == 0.0 and result["validations_compared"] == 2


def test_a_damaged_last_checkpoint_is_refused_not_compared_at_an_earlier_step(runs, capsys, tmp_path):
    damaged = tmp_path / "b"
    shutil.copytree(runs / "b", damaged)
    weights = damaged / "checkpoints" / "step_000002" / "unit_0001.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    line = _refused(capsys, runs / "a", damaged)
    assert "step_000001, is of step 1, not of its last logged step 2" in line
    assert "step_000002 skipped:" in line


@pytest.mark.parametrize("first,second", [("a", "c"), ("c", "a")])
def test_validation_is_compared_only_where_both_runs_validated(runs, first, second):
    result = compare_runs.compare(runs / first, runs / second)
    assert result["validations_compared"] == 1 and result["max_rel_val_loss_diff"] == 0.0


@pytest.mark.parametrize("other,needle", [
    ("d", "has no checkpoint that verifies (trained with --no-checkpoints?)"),
    ("e", "trained different models: dim 32 vs 16"),
    ("missing", "missing/metrics.jsonl does not exist"),
])
def test_runs_that_cannot_be_compared_are_refused_in_one_line(runs, capsys, other, needle):
    assert needle in _refused(capsys, runs / "a", runs / other)
