"""Run the `ratrain` command line in-process, as a user would, and capture what it says."""

from __future__ import annotations

import sys

from ratrain.cli import main


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
