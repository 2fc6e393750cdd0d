"""Run the `ratrain` command line in-process, as a user would, and capture what it says."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from ratrain.cli import main
from ratrain.data.corpus import stdlib_files


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ratrain *args`."""
    monkeypatch.setattr(sys, "argv", ["ratrain", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_ok(monkeypatch, capsys, *args: str) -> str:
    """run_cli's stdout, for a command that must succeed (its stderr in the failure)."""
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    return out


def train_refused(monkeypatch, capsys, *args: str) -> str:
    """The one error line of `ratrain train --no-progress *args`, which must refuse them (exit
    2, one line, no traceback)."""
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-progress", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def small_config(tmp_path: Path, **train) -> Path:
    """A run config (YAML in tmp_path) whose model and corpus are small enough that a few steps
    in this process take a second: 2 steps, a checkpoint after each, unless `train` says."""
    data = tmp_path / "text"
    data.mkdir(exist_ok=True)
    shutil.copy(next(f for f in stdlib_files() if f.name == "textwrap.py"), data)
    cfg = {"model": {"name": "small", "vocab_size": 257, "dim": 32, "n_layers": 2, "n_heads": 2,
                     "ffn_dim": 64, "max_seq_len": 64},
           "data": {"path": str(data)},
           "train": {"seq_len": 16, "global_batch": 4, "micro_batch_size": 2, "steps": 2,
                     "eval_batches": 0, "checkpoint_every": 1, **train}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
