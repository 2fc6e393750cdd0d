"""An --out of `tokenizer`, `export` and `merge-parts` that cannot be written is refused before
the work (training, hashing the checkpoint); `export` refuses another model's config.json or
tokenizer.json in --out; a --sync diloco export before the first outer sync says it writes the
starting weights; an export beside a run whose keep-K removes the checkpoint it chose scans
again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ratrain import checkpoint

from .cli_runner import run_cli, run_cli_ok, small_config


@pytest.fixture
def run(monkeypatch, capsys, tmp_path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    run_cli_ok(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
               "--run-dir", "run", "--threads", "1", "--no-progress", "--no-report")
    return tmp_path / "run"


def _never(*args, **kwargs):
    raise AssertionError("the work ran before --out was checked")


def test_a_tokenizer_out_under_a_file_is_refused_before_training(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text("the cat sat on the mat\n" * 50)
    monkeypatch.setattr("ratrain.data.tokenizer.train_bpe", _never)
    code, _, err = run_cli(monkeypatch, capsys, "tokenizer", "--data", "corpus.txt",
                           "--out", "corpus.txt/tok.json")
    assert code == 2, err
    assert err == "error: --out corpus.txt/tok.json: corpus.txt is not a directory\n"


def test_an_export_or_merge_out_under_a_file_is_refused_before_the_checkpoint_is_read(
        monkeypatch, capsys, run):
    monkeypatch.setattr(checkpoint, "scan", _never)
    monkeypatch.setattr(checkpoint, "load_meta", _never)
    for command, out in (("export", "run/config.yaml/hf"), ("merge-parts", "run/config.yaml/m")):
        code, _, err = run_cli(monkeypatch, capsys, command, "run", "--out", out)
        assert code == 2, err
        assert err == f"error: --out {out}: run/config.yaml is not a directory\n"


def test_another_models_config_or_tokenizer_in_out_is_refused(monkeypatch, capsys, run):
    run_cli_ok(monkeypatch, capsys, "export", "run", "--out", "first")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        out = Path(f"other_{name}")
        out.mkdir()
        other = json.loads(Path("first", name).read_text())
        other["from"] = "another model"
        (out / name).write_text(json.dumps(other))
        kept = (out / name).read_text()
        code, _, err = run_cli(monkeypatch, capsys, "export", "run", "--out", str(out))
        assert code == 2, err
        assert err.startswith(f"error: {out / name} already exists and is not the {name} this "
                              "export writes"), err
        assert (out / name).read_text() == kept and not (out / "model.safetensors").exists()
    # the files an export of this run writes are not another model's: kept as they are
    again = Path("again")
    again.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        shutil.copy(Path("first", name), again / name)
    run_cli_ok(monkeypatch, capsys, "export", "run", "--out", str(again))
    assert (again / "model.safetensors").is_file()


def test_a_diloco_export_before_the_first_outer_sync_says_it_writes_the_starting_weights(
        monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    run_cli_ok(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path, steps=3)),
               "--run-dir", "run", "--threads", "1", "--no-progress", "--no-report",
               "--dp", "2", "--sync", "diloco:5", "--keep-checkpoints", "3")
    said = run_cli_ok(monkeypatch, capsys, "export", "run", "--out", "final")
    assert "the replicas' last outer sync" in said  # the run's last step syncs them all
    shutil.rmtree("run/checkpoints/step_000003")
    said = run_cli_ok(monkeypatch, capsys, "export", "run", "--out", "early")
    assert ("no outer sync yet at step 2, the first is at step 5: these are the starting "
            "weights; --replica R exports a replica's trained weights") in said
    assert "last outer sync" not in said


def test_an_export_whose_chosen_checkpoint_is_rotated_away_scans_again(
        monkeypatch, capsys, run):
    scan, calls = checkpoint.scan, []

    def rotating(where, hashed=True):  # the run's keep-K removes the one found, as if newer came
        found, skipped = scan(where, hashed)
        calls.append(found.name)
        if len(calls) == 1:
            shutil.rmtree(found)
        return found, skipped

    monkeypatch.setattr(checkpoint, "scan", rotating)
    said = run_cli_ok(monkeypatch, capsys, "export", "run", "--out", "hf")
    assert calls == ["step_000002", "step_000001"]
    assert said.startswith("exported step_000001 of run to hf")


def test_an_export_whose_checkpoints_keep_vanishing_says_they_were_removed(
        monkeypatch, capsys, run):
    scan = checkpoint.scan

    def vanishing(where, hashed=True):  # each scan's newest is gone once it is read
        found, skipped = scan(where, hashed)
        return found.with_name("step_000099"), skipped

    monkeypatch.setattr(checkpoint, "scan", vanishing)
    code, _, err = run_cli(monkeypatch, capsys, "export", "run", "--out", "hf")
    assert code == 2, err
    assert "was removed while being read (a run training in run rotates its checkpoints)" in err
    assert "did not finish" not in err


def test_an_export_whose_checkpoint_is_rotated_away_as_it_loads_takes_the_next(
        monkeypatch, capsys, run):
    load, loaded = checkpoint.load_units, []

    def rotating(ckpt, *args, **kwargs):  # removed after resume_point chose it, as it is read
        loaded.append(ckpt.name)
        if len(loaded) == 1:
            shutil.rmtree(ckpt)
        return load(ckpt, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "load_units", rotating)
    said = run_cli_ok(monkeypatch, capsys, "export", "run", "--out", "hf")
    assert loaded == ["step_000002", "step_000001"]
    assert said.startswith("exported step_000001 of run to hf")
