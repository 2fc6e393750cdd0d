"""Every command with --json prints an object on stdout when it is refused, as `plan` does:
{"error": the line stderr says}, exit 2. Until 2026-12-04 `simulate`, `report`, `profile`,
`models` and `train` printed nothing on stdout there, and a script reading it got no JSON."""

from __future__ import annotations

import json

import pytest

from .cli_runner import run_cli


@pytest.mark.parametrize("args", [
    ("simulate", "--json", "--profile", "no-such-profile"),  # a UserError
    ("simulate", "--json", "--pp", "two"),  # click's own refusal
    ("report", "--json", "no-such-run"),
    ("models", "--json", "--dtype", "float8"),
    ("profile", "--json", "--model", "no-such-model"),
    ("train", "--json", "--steps", "0"),
], ids=lambda a: " ".join(a[:1] + a[2:]))
def test_a_refused_command_with_json_prints_its_error_as_an_object(monkeypatch, capsys,
                                                                   tmp_path, args):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2, (out, err)
    said = json.loads(out)
    assert set(said) == {"error"} and said["error"]
    assert said["error"].splitlines()[0] in err  # the same refusal as the line on stderr
