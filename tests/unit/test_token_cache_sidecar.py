"""A token cache without its files' findings beside it (KEY.undecodable): one written before
they were kept (2026-12-03), or while they were KEY.undecodable.json, kept for corpora with a
finding alone. Its binary files were never warned of again. The run that says the warnings
reads the files again for them (not tokenizing), keeps them, and says them; every rank's
loader maps the stream without that read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ratrain.config import DataConfig, RunConfig
from ratrain.data import ByteTokenizer, check_data, load_tokens, make_data
from ratrain.data import corpus as corpus_module
from ratrain.data import tokens as tokens_module
from ratrain.models.presets import get_preset

from .cli_runner import run_cli, small_config


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _corpus(tmp_path, binary: bool = True):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("plain text that is text\n" * 60)
    blob = corpus / "ids.txt"  # a binary file under a text suffix
    if binary:
        blob.write_bytes(np.random.default_rng(0).integers(128, 256, 4000,
                                                           dtype=np.uint8).tobytes())
    return corpus, blob


def _cfg(path) -> RunConfig:
    cfg = RunConfig(model=get_preset("tiny"))
    cfg.data.path = str(path)
    cfg.train.steps, cfg.train.seq_len, cfg.train.global_batch = 3, 16, 4
    cfg.train.eval_batches = 0
    return cfg


def _sidecar(tmp_path):
    (found,) = (tmp_path / "cache" / "tokens").glob("*.undecodable")
    return found


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def _no_tokenizing(monkeypatch):
    def tokenized(*args, **kwargs):
        raise AssertionError("the cached stream was tokenized again")

    monkeypatch.setattr(tokens_module, "_tokenize_to", tokenized)


def _no_second_read(monkeypatch):
    def read(*args, **kwargs):
        raise AssertionError("the files were read again for their findings")

    monkeypatch.setattr(tokens_module, "find_again", read)


def test_a_cache_without_its_findings_warns_of_its_binary_file_again(tmp_path, capsys,
                                                                     monkeypatch):
    corpus, blob = _corpus(tmp_path)
    check_data(_cfg(corpus))
    said = _warnings(capsys.readouterr().err)
    assert len(said) == 1 and said[0].startswith(f"warning: {blob}: "), said
    found = _sidecar(tmp_path)
    kept = json.loads(found.read_text())
    (stream,) = found.parent.glob("*.bin")
    before = stream.stat().st_mtime_ns
    found.unlink()  # as a cache written before 2026-12-03 is

    _no_tokenizing(monkeypatch)
    check_data(_cfg(corpus))
    assert _warnings(capsys.readouterr().err) == said
    assert json.loads(found.read_text()) == kept  # kept again: the next run reads it
    assert stream.stat().st_mtime_ns == before  # the stream as it was, not rebuilt

    _no_second_read(monkeypatch)
    check_data(_cfg(corpus))
    assert _warnings(capsys.readouterr().err) == said


def test_a_clean_corpus_keeps_an_empty_finding_and_is_not_read_again(tmp_path, capsys,
                                                                     monkeypatch):
    corpus, _ = _corpus(tmp_path, binary=False)
    cfg = DataConfig(path=str(corpus))
    first = load_tokens(cfg, ByteTokenizer(), progress=False)
    found = _sidecar(tmp_path)
    assert json.loads(found.read_text())["undecodable"] == []  # no file: a cache from before findings were kept
    _no_tokenizing(monkeypatch)
    _no_second_read(monkeypatch)
    assert np.array_equal(load_tokens(cfg, ByteTokenizer(), progress=False), first)
    assert _warnings(capsys.readouterr().err) == []


def test_an_old_clean_cache_is_read_once_for_its_findings(tmp_path, capsys, monkeypatch):
    corpus, _ = _corpus(tmp_path, binary=False)
    cfg = DataConfig(path=str(corpus))
    load_tokens(cfg, ByteTokenizer(), progress=False)
    found = _sidecar(tmp_path)
    found.unlink()
    _no_tokenizing(monkeypatch)
    load_tokens(cfg, ByteTokenizer(), progress=False)
    assert json.loads(found.read_text())["undecodable"] == []
    assert _warnings(capsys.readouterr().err) == []


def test_every_ranks_loader_maps_an_old_cache_without_reading_its_files(tmp_path, monkeypatch):
    corpus, _ = _corpus(tmp_path)
    cfg = _cfg(corpus)
    check_data(cfg)
    _sidecar(tmp_path).unlink()
    _no_tokenizing(monkeypatch)
    _no_second_read(monkeypatch)
    for replica in range(2):  # what the training loop of each replica builds
        loader, _ = make_data(cfg, ByteTokenizer(), 2, replica)
        assert loader.n_windows > 0


def test_a_cache_that_cannot_be_written_still_warns(tmp_path, capsys, monkeypatch):
    """A shared cache this user may read but not write: the findings are said, not kept."""
    corpus, blob = _corpus(tmp_path)
    check_data(_cfg(corpus))
    said = _warnings(capsys.readouterr().err)
    _sidecar(tmp_path).unlink()

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache"))

    monkeypatch.setattr(corpus_module, "keep_findings", read_only)
    for _ in range(2):
        check_data(_cfg(corpus))
        assert _warnings(capsys.readouterr().err) == said
    assert not list((tmp_path / "cache" / "tokens").glob("*.undecodable"))


def test_train_warns_of_the_binary_file_of_an_old_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = small_config(tmp_path, steps=1, checkpoint_every=0)
    blob = tmp_path / "text" / "ids.txt"
    blob.write_bytes(np.random.default_rng(0).integers(128, 256, 4000, dtype=np.uint8).tobytes())
    args = ("train", "--config", str(config), "--threads", "1", "--no-report",
            "--no-checkpoints", "--no-progress")
    code, _, err = run_cli(monkeypatch, capsys, *args, "--run-dir", "one")
    assert code == 0, err
    said = _warnings(err)
    assert len(said) == 1 and said[0].startswith(f"warning: {blob}: "), said
    _sidecar(tmp_path).unlink()
    code, _, err = run_cli(monkeypatch, capsys, *args, "--run-dir", "two")
    assert code == 0, err
    assert _warnings(err) == said


def test_a_cache_inside_the_corpus_is_no_part_of_it(tmp_path, monkeypatch):
    """The findings were a .json file: a cache under the data directory added them to the
    corpus, a new one (tokenized again) every run."""
    corpus, _ = _corpus(tmp_path, binary=False)
    monkeypatch.setenv("RATRAIN_CACHE", str(corpus / "cache"))
    cfg = DataConfig(path=str(corpus))
    first = tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False)
    assert [f.name for f in first.files] == ["a.txt"] and first.warnings == []
    _no_tokenizing(monkeypatch)
    again = tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False)
    assert again.files == first.files and np.array_equal(again.tokens, first.tokens)
