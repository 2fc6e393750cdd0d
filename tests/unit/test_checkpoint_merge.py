"""`ratrain merge-parts` (checkpoint/merge.py) refuses parts that are not one run's every node:
a whole checkpoint, parts of different runs, a rank missing, a file two parts hold that differs.
The merge itself is tested end to end with two torchrun nodes (tests/distributed/
test_shared_dir.py)."""

from __future__ import annotations

import pytest
import torch

from ratrain import checkpoint
from ratrain.checkpoint.merge import merge_parts, newest_common_step
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.models.presets import get_preset


def _part(root, step: int, ranks, value: float, lr: float = 1e-3, unit: int = 0, whole=False):
    files = checkpoint.save_units(root, step, {unit: {"weights": {"w": torch.full((2,), value)},
                                                      "optim": None}})
    config = {"model": {}, "parallel": {"pp": 1, "dp": 2}, "train": {"lr": lr}}
    meta = {"config": config, "loader": {}, "rng": {str(r): {} for r in ranks}}
    return checkpoint.finalize(root, step, {**meta, **({} if whole else {"ranks": ranks})},
                               files, keep=3)


def test_two_parts_of_one_run_merge_and_anything_else_is_refused(tmp_path):
    a, b = _part(tmp_path / "a", 2, [0], 1.0), _part(tmp_path / "b", 2, [1], 1.0)
    _part(tmp_path / "b", 4, [1], 1.0)  # only b has step 4
    assert newest_common_step([tmp_path / "a", tmp_path / "b"]) == (2, [])
    merged = merge_parts([a, b], tmp_path / "out", 2)
    meta = checkpoint.load_meta(merged)
    assert "ranks" not in meta and sorted(meta["rng"]) == ["0", "1"]
    assert checkpoint.manifest.problem(merged) is None
    cases = [
        ([a, _part(tmp_path / "w", 2, [1], 1.0, whole=True)], "is a whole checkpoint"),
        ([a, _part(tmp_path / "lr", 2, [1], 1.0, lr=2e-3)], "of different runs"),
        ([a], r"hold ranks \[0\], the run had 2: a node's part is missing"),
        ([a, _part(tmp_path / "c", 2, [1], 5.0)], "unit_0000.safetensors differs between"),
    ]
    for n, (parts, message) in enumerate(cases):
        with pytest.raises(UserError, match=message):
            merge_parts(parts, tmp_path / f"refused_{n}", 2)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_newest_step_in_one_part_is_skipped_and_said(tmp_path, monkeypatch, capsys,
                                                               damage):
    """As resume and export do: the newest step every part holds that verifies. A bit flipped
    in one part's newest step refused the merge; a truncated file merged the older step
    without a word."""
    from .cli_runner import run_cli

    runs = {}
    for node, ranks in (("a", [0]), ("b", [1])):
        run = tmp_path / node
        run.mkdir()
        RunConfig(model=get_preset("tiny")).save(run / "config.yaml")
        for step in (2, 4):
            _part(run, step, ranks, 1.0)
        runs[node] = run
    bad = runs["b"] / "checkpoints" / "step_000004" / "unit_0000.safetensors"
    data = bytearray(bad.read_bytes())
    if damage == "flip":
        data[-1] ^= 1
    bad.write_bytes(bytes(data if damage == "flip" else data[:10]))
    code, out, err = run_cli(monkeypatch, capsys, "merge-parts", str(runs["a"]), str(runs["b"]),
                             "--out", str(tmp_path / "out"))
    assert code == 0, err
    why = "does not match its sha256" if damage == "flip" else "is truncated"
    assert err.count("\n") == 1 and err.startswith(
        f"skipping checkpoint step_000004: {bad.parent}: unit_0000.safetensors {why}"), err
    assert "the newest step every part holds that verifies is step_000002" in err
    assert "merged step_000002" in out
    assert [p.name for p in checkpoint.complete_dirs(tmp_path / "out")] == ["step_000002"]


@pytest.mark.parametrize("b_steps", [(2, 4), (2,)])
def test_rank_0s_run_files_come_along_and_summary_json_only_of_the_runs_end(
        tmp_path, monkeypatch, capsys, b_steps):
    """The run's tokenizer copy (export's and a resume's where the original moved), and where
    the merged step is the run's end, its summary.json (naming the merged run) and trace.json:
    until 2026-12-04 left out, `ratrain report` said the finished run did not reach its end."""
    import json

    from .cli_runner import run_cli

    runs = {}
    for node, ranks, steps in (("a", [0], (2, 4)), ("b", [1], b_steps)):
        run = runs[node] = tmp_path / node
        run.mkdir()
        RunConfig(model=get_preset("tiny")).save(run / "config.yaml")
        for step in steps:
            _part(run, step, ranks, 1.0)
    a = runs["a"]  # rank 0 alone writes these
    (a / "tokenizer.json").write_text('{"model": {}}')
    (a / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                                             for s in (1, 2, 3, 4)))
    (a / "summary.json").write_text(json.dumps({"run_dir": str(a), "steps": 4, "final_loss": 1.0}))
    (a / "trace.json").write_text('{"traceEvents": []}')
    out = tmp_path / "out"
    code, said, err = run_cli(monkeypatch, capsys, "merge-parts", str(a), str(runs["b"]),
                              "--out", str(out))
    assert code == 0, err
    for name in ("tokenizer.json", "metrics.jsonl"):
        assert (out / name).read_bytes() == (a / name).read_bytes()
    if len(b_steps) == 2:
        assert "merged step_000004" in said and err == ""
        assert json.loads((out / "summary.json").read_text()) == {
            "run_dir": str(out.absolute()), "steps": 4, "final_loss": 1.0}
        assert (out / "trace.json").read_bytes() == (a / "trace.json").read_bytes()
    else:  # step 2 resumes to train 3-4 again: the end's figures would not be of it
        assert "merged step_000002" in said
        assert err == (f"note: step_000002 is not the run's end (step 4, which not every part "
                       f"holds): summary.json and trace.json, of the end, are left out of {out}\n")
        assert not (out / "summary.json").exists() and not (out / "trace.json").exists()
