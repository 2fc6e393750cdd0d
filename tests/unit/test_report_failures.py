"""`ratrain report` of what it cannot read or write: a run directory that does not exist, a
metrics.jsonl damaged part way or in its only line (named with its line), a summary.json of
wrong-typed values (read as one cut short: figures from metrics.jsonl), and a disk that fills
while the report is written (one line, exit 2, as a read-only one). The run directory is
written here, as `ratrain train` writes it, without training."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import matplotlib.figure
import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.report import write_report
from ratrain.report.run import load_run

from .cli_runner import run_cli

FULL = os.strerror(errno.ENOSPC)


def _run_dir(tmp_path: Path, rows: int = 4) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg = RunConfig()
    cfg.train.steps = rows
    cfg.save(run / "config.yaml")
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 6.0 - 0.1 * s, "tokens_per_s": 1000.0,
                    "step_time_s": 2.0, "peak_memory_bytes": 4e8 + s}) + "\n"
        for s in range(1, rows + 1)))
    (run / "summary.json").write_text(json.dumps({
        "steps": rows, "final_loss": 5.6, "tokens_per_s": 1000.0,
        "tokens_per_s_of_steps": f"2-{rows}", "peak_memory_bytes": 4.1e8}))
    return run


def test_a_run_directory_that_does_not_exist_is_said_to_not_exist(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "report", str(tmp_path / "nosuch"))
    assert code == 2
    assert err.strip() == f"error: {tmp_path / 'nosuch'}: no such directory"


def test_a_damaged_metrics_line_is_named_with_its_file_and_line(tmp_path):
    run = _run_dir(tmp_path)
    log = run / "metrics.jsonl"
    lines = log.read_text().splitlines()
    lines[2] = "garbage"
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as raised:
        load_run(run)
    assert str(raised.value) == f"{log} is damaged: line 3: Expecting value (column 1)"


@pytest.mark.parametrize("damaged, said", [("hello", "Expecting value (column 1)"),
                                           ('{"step": 1, "loss": 5.',
                                            "Expecting ',' delimiter (column 22)")])
def test_a_damaged_last_metrics_line_is_left_out_after_rows_and_named_when_alone(
        monkeypatch, capsys, tmp_path, damaged, said):
    """numbered_rows leaves a damaged last line out as a write cut short: the report called a
    file of only that line empty, "the run has not taken a step"."""
    run = _run_dir(tmp_path)
    log = run / "metrics.jsonl"
    log.write_text(log.read_text() + damaged + "\n")
    assert [row["step"] for row in load_run(run).metrics] == [1, 2, 3, 4]
    log.write_text(damaged + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "report", str(run))
    assert code == 2
    assert err.strip() == f"error: {log} is damaged: line 1: {said}"


@pytest.mark.parametrize("key, value", [("peak_memory_bytes", "x"), ("tokens_per_s", [1]),
                                        ("ledger_peak_bytes_per_stage", ["a"])])
def test_a_summary_of_wrong_typed_values_is_read_as_one_cut_short(tmp_path, key, value):
    run = _run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, key: value}))
    written = write_report(run)
    assert written.page.is_file()
    assert any(note.startswith(f"summary.json could not be read (its {key} ")
               and note.endswith(": figures from metrics.jsonl") for note in written.notes)
    assert dict(written.table)["peak memory"] == "process peak 400.00 MB"  # metrics.jsonl's


def test_a_whole_summary_is_read(tmp_path):
    written = write_report(_run_dir(tmp_path))
    assert not [note for note in written.notes if "summary.json" in note]
    assert dict(written.table)["peak memory"] == "process peak 410.00 MB"


@pytest.mark.parametrize("what", ["picture", "page"])
def test_a_report_that_meets_a_full_disk_says_so_in_one_line(monkeypatch, capsys, tmp_path,
                                                             what):
    run = _run_dir(tmp_path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, FULL)

    if what == "picture":
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    else:
        real_write = Path.write_text
        monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: (
            full() if self.name == "index.html" else real_write(self, *a, **k)))
    code, _, err = run_cli(monkeypatch, capsys, "report", str(run))
    assert code == 2
    assert err.strip() == f"error: cannot write the report into {run / 'report'}: {FULL}"
    assert not list((run / "report").iterdir())  # the staging directory went too
