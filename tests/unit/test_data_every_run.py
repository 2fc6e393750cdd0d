"""What the data layer tells every run, not only the one that tokenizes: files that are mostly
undecodable bytes (the finding is kept beside the cached stream), a validation set smaller than
--eval-batches asks, and the count of the files it read."""

from __future__ import annotations

import numpy as np
import pytest

from ratrain.config import DataConfig, RunConfig
from ratrain.data import ByteTokenizer, check_data, eval_batches, load_tokens, split_train_val
from ratrain.data import corpus as corpus_module
from ratrain.data import tokens as tokens_module
from ratrain.models.presets import get_preset

from .cli_runner import run_cli, small_config


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "env-cache"))


def _cfg(path, steps=3, eval_batches=0, val_fraction=0.05) -> RunConfig:
    cfg = RunConfig(model=get_preset("tiny"))
    cfg.data.path = str(path)
    cfg.train.steps, cfg.train.seq_len, cfg.train.global_batch = steps, 16, 4
    cfg.train.micro_batch_size = 2
    cfg.train.eval_batches, cfg.data.val_fraction = eval_batches, val_fraction
    return cfg


def _corpus_with_a_binary_file(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("plain text that is text\n" * 60)
    blob = corpus / "sub" / "ids.txt"  # a binary file under a text suffix
    blob.write_bytes(np.random.default_rng(0).integers(128, 256, 4000, dtype=np.uint8).tobytes())
    return corpus, blob


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def test_a_mostly_undecodable_file_is_warned_of_when_its_cache_is_read(tmp_path, capsys,
                                                                      monkeypatch):
    """The warning was said while tokenizing alone: every later run, reading the token cache,
    trained on the file without a word."""
    corpus, blob = _corpus_with_a_binary_file(tmp_path)
    cfg = DataConfig(path=str(corpus), cache_dir=str(tmp_path / "cache"))
    first = load_tokens(cfg, ByteTokenizer(), progress=False)
    said = _warnings(capsys.readouterr().err)
    assert len(said) == 1 and said[0].startswith(f"warning: {blob}: ")

    def no_second_tokenization(*args, **kwargs):
        raise AssertionError("the second run tokenized again instead of reading the cache")

    monkeypatch.setattr(tokens_module, "_tokenize_to", no_second_tokenization)
    again = load_tokens(cfg, ByteTokenizer(), progress=False)
    assert _warnings(capsys.readouterr().err) == said  # the same file, the same fraction
    assert np.array_equal(again, first)


def test_every_run_on_a_mostly_undecodable_file_warns_once_at_its_start(tmp_path, capsys):
    corpus, blob = _corpus_with_a_binary_file(tmp_path)
    for run in range(2):  # the first tokenizes, the second maps the cache
        check_data(_cfg(corpus))
        said = _warnings(capsys.readouterr().err)
        assert len(said) == 1 and said[0].startswith(f"warning: {blob}: "), (run, said)
    check_data(_cfg(corpus), first=False)  # another rank than the run's first
    assert _warnings(capsys.readouterr().err) == []
    (corpus / "sub" / "ids.txt").unlink()  # a new corpus, tokenized afresh: no finding left
    check_data(_cfg(corpus))
    check_data(_cfg(corpus))
    assert _warnings(capsys.readouterr().err) == []


def _eval_notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: --eval-batches")]


def test_eval_batches_beyond_the_validation_split_are_said_once_with_the_way_out(tmp_path,
                                                                                capsys):
    """--eval-batches 100 validated on the split's few sequences without a word."""
    text = tmp_path / "a.txt"
    text.write_text("hello world, some text.\n" * 100)  # 2,401 tokens, 120 of them validation
    cfg = _cfg(text, eval_batches=100)
    check_data(cfg)
    notes = _eval_notes(capsys.readouterr().err)
    val = split_train_val(load_tokens(cfg.data, ByteTokenizer(), progress=False),
                          cfg.data.val_fraction)[1]
    got = 2 * len(eval_batches(val, 16, 2, 400))  # what the run validates on: 6 sequences
    assert len(notes) == 1, notes
    assert "asks for 400 validation sequences" in notes[0]
    assert f"validates on {got} (1.5 batches of 4) instead" in notes[0]
    assert "a larger --val-fraction" in notes[0]
    for fits in (_cfg(text, eval_batches=1), _cfg(text, eval_batches=0),
                 _cfg(text, eval_batches=2, val_fraction=0.5)):
        check_data(fits)
    check_data(cfg, first=False)  # another rank than the run's first
    assert _eval_notes(capsys.readouterr().err) == []


def test_the_run_start_says_the_cap_of_its_validation_set(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config",
                           str(small_config(tmp_path, steps=1)),
                           "--eval-batches", "1000", "--threads", "1", "--no-progress",
                           "--run-dir", str(tmp_path / "run"))
    assert code == 0, err
    assert len(_eval_notes(err)) == 1, err


def test_the_files_said_are_the_files_read(tmp_path, capsys, monkeypatch):
    """check_data listed the corpus a second time to count its files: a file added between
    the two listings was counted but never read."""
    corpus, _ = _corpus_with_a_binary_file(tmp_path)
    listed = []
    real = corpus_module.text_files

    def listing(path):
        listed.append(path)
        return real(path)

    monkeypatch.setattr(corpus_module, "text_files", listing)
    check_data(_cfg(corpus, steps=1), progress=True)
    assert f"data {corpus}: 2 files," in capsys.readouterr().err
    assert len(listed) == 1  # once, by what reads it
