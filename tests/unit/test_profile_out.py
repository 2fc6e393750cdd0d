"""`ratrain profile --out`: a path the profile cannot be written to is refused before the
measuring (a minute, lost when an existing directory failed only at the write)."""

import pytest

from ratrain.errors import UserError

from .cli_runner import run_cli


@pytest.fixture
def measured(monkeypatch):
    """What reached the measuring: each call's --out is recorded, nothing is measured."""
    calls = []

    def measure(*args, **kwargs):
        calls.append(args)
        raise UserError("measuring")

    monkeypatch.setattr("ratrain.profiling.measure.measure", measure)
    return calls


def test_a_directory_or_a_path_under_a_file_is_refused_before_measuring(
        monkeypatch, capsys, tmp_path, measured):
    (tmp_path / "a_file").write_text("")
    for out, needle in ((tmp_path, "is a directory"),
                        (tmp_path / "a_file" / "p.yaml", "is not a directory")):
        code, _, err = run_cli(monkeypatch, capsys, "profile", "--repeats", "1", "--out",
                               str(out))
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert measured == []


def test_a_writable_path_is_measured_for_and_the_trial_write_leaves_nothing(
        monkeypatch, capsys, tmp_path, measured):
    for out in (tmp_path / "p.yaml", tmp_path / "new" / "dir" / "p.yaml"):
        code, _, err = run_cli(monkeypatch, capsys, "profile", "--repeats", "1", "--out",
                               str(out))
        assert code == 2 and "measuring" in err, err
    assert len(measured) == 2 and list(tmp_path.iterdir()) == []
