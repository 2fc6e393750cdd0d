"""Token caches as disks and people leave them: a stream truncated, emptied or cut short, its
KEY.undecodable unreadable (a cache miss, tokenized again, not a traceback nor a run on part of
the stream); a cache that cannot be written (one line naming it, not its temporary file); and
data paths the corpus reader took for something else (a nanoGPT directory's .bin files skipped
without a word, a pipe called an empty directory)."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from ratrain.config import DataConfig, RunConfig
from ratrain.data import ByteTokenizer, check_data
from ratrain.data import tokens as tokens_module
from ratrain.data.corpus import text_files
from ratrain.errors import UserError
from ratrain.models.presets import get_preset


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _cached(tmp_path):
    data = tmp_path / "small.txt"
    data.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    cfg = DataConfig(path=str(data))
    first = np.array(tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False).tokens)
    (stream,) = (tmp_path / "cache" / "tokens").glob("*.bin")
    return cfg, first, stream, stream.with_suffix(".undecodable")


def _read_again(cfg, capsys):
    corpus = tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False)
    return np.array(corpus.tokens), corpus.warnings, capsys.readouterr().err


def _damage_bin(stream, how):
    data = stream.read_bytes()
    stream.write_bytes({"odd": data[:1001], "empty": b"", "short": data[:400]}[how])


@pytest.mark.parametrize("how", ["odd", "empty", "short"])
def test_a_damaged_stream_is_tokenized_again_with_a_warning(tmp_path, capsys, how):
    cfg, first, stream, _ = _cached(tmp_path)
    _damage_bin(stream, how)
    again, warnings, err = _read_again(cfg, capsys)
    assert np.array_equal(again, first)  # the whole stream, not the 200 tokens left of it
    assert err.startswith(f"warning: the token cache entry {stream} is damaged (")
    assert len(err.splitlines()) == 1 and warnings == []
    assert stream.stat().st_size == first.nbytes


@pytest.mark.parametrize("text, why", [("{x", "not JSON"),
                                       ('[["a"]]', "not a list of [file, fraction]"),
                                       ('{"undecodable": []}', "no token count")])
def test_a_damaged_findings_file_is_a_cache_miss(tmp_path, capsys, text, why):
    cfg, first, _, found = _cached(tmp_path)
    found.write_text(text)
    again, warnings, err = _read_again(cfg, capsys)
    assert np.array_equal(again, first) and warnings == []
    assert err.strip() == (f"warning: the token cache entry {found} is damaged ({why}): "
                           "tokenizing the data again")
    assert json.loads(found.read_text()) == {"tokens": len(first), "undecodable": []}


def test_the_stream_length_is_kept_and_an_old_findings_list_still_reads(tmp_path, capsys,
                                                                       monkeypatch):
    cfg, first, _, found = _cached(tmp_path)
    assert json.loads(found.read_text()) == {"tokens": len(first), "undecodable": []}
    found.write_text("[]")  # as kept before the length was, on 2026-12-03

    def tokenized(*args, **kwargs):
        raise AssertionError("the cached stream was tokenized again")

    monkeypatch.setattr(tokens_module, "_tokenize_to", tokenized)
    again, warnings, err = _read_again(cfg, capsys)
    assert np.array_equal(again, first) and warnings == [] and err == ""
    found.unlink()  # before findings were kept: read again once, and kept with the length
    assert _read_again(cfg, capsys)[1] == []
    assert json.loads(found.read_text()) == {"tokens": len(first), "undecodable": []}


def test_a_waiting_rank_maps_the_stream_only_once_it_is_whole(tmp_path):
    answers = iter([False, False, True])
    tokens_module._wait_for(tmp_path, every_s=0, ready=lambda: next(answers))
    assert next(answers, "done") == "done"


def _unwritable_message(directory, why):
    return (f"cannot write the token cache {directory} ({why}): set RATRAIN_CACHE (or "
            "data.cache_dir in a --config file) to a writable directory")


def test_a_cache_path_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "small.txt").write_text("some text\n" * 20)
    cfg = DataConfig(path=str(tmp_path / "small.txt"))
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "afile"))
    with pytest.raises(UserError) as e:
        tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False)
    assert str(e.value) == _unwritable_message(tmp_path / "afile" / "tokens",
                                               f"{tmp_path / 'afile'} is not a directory")
    (tmp_path / "c2").mkdir()
    (tmp_path / "c2" / "tokens").write_text("")
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "c2"))
    with pytest.raises(UserError) as e:
        tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False)
    assert str(e.value) == _unwritable_message(tmp_path / "c2" / "tokens",
                                               f"{tmp_path / 'c2' / 'tokens'} is not a directory")


@pytest.mark.parametrize("where", ["mkstemp", "replace"])
def test_a_read_only_cache_names_the_cache_not_its_temporary_file(tmp_path, monkeypatch,
                                                                  where):
    (tmp_path / "small.txt").write_text("some text\n" * 20)
    cfg = DataConfig(path=str(tmp_path / "small.txt"))
    directory = tmp_path / "cache" / "tokens"

    def read_only(*args, **kwargs):  # root writes a chmod 555 directory: the OS's error
        raise OSError(errno.EROFS, "Read-only file system", str(directory / ".tmp-x.part"))

    target = tokens_module.tempfile if where == "mkstemp" else tokens_module.os
    monkeypatch.setattr(target, where, read_only)
    with pytest.raises(UserError) as e:
        tokens_module.read_corpus(cfg, ByteTokenizer(), progress=False)
    assert str(e.value) == _unwritable_message(directory, "Read-only file system")
    assert not list(directory.glob(".tmp-*"))


def _cfg(path) -> RunConfig:
    cfg = RunConfig(model=get_preset("tiny"))
    cfg.data.path = str(path)
    cfg.train.steps, cfg.train.seq_len, cfg.train.global_batch = 2, 16, 2
    cfg.train.eval_batches = 0
    return cfg


def _notes(err):
    return [line for line in err.splitlines() if "pre-tokenized" in line]


def test_a_directory_of_bin_files_says_they_were_skipped(tmp_path, capsys, monkeypatch):
    data = tmp_path / "shakespeare"  # nanoGPT's layout
    data.mkdir()
    (data / "prepare.py").write_text("print('prepare')\n" * 30)
    (data / "readme.md").write_text("the tiny shakespeare data set\n" * 30)
    for name in ("train.bin", "val.bin"):
        (data / name).write_bytes(np.arange(500, dtype="<u2").tobytes())
    # a token cache inside the directory: its streams are none of the user's
    monkeypatch.setenv("RATRAIN_CACHE", str(data / "cache"))
    for _ in range(2):
        check_data(_cfg(data))
        assert _notes(capsys.readouterr().err) == [
            f"note: data directory {data} holds pre-tokenized train.bin, val.bin, which a run on "
            "the directory skips (it reads its 2 text files); a pre-tokenized stream is passed "
            f"as one .bin file: --data {data / 'train.bin'}"]


def test_a_pipe_or_a_device_is_refused_as_neither_file_nor_directory(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        with pytest.raises(UserError) as e:
            text_files(path)
        assert str(e.value) == (f"data path {path} is neither a file nor a directory (a pipe "
                                "or a device): write the data to a file and pass that")


def test_files_of_other_suffixes_are_named_and_a_linked_file_is_read_once(tmp_path, capsys,
                                                                          monkeypatch):
    """Until 2026-12-04 a README or a .log beside the text was dropped without a word, and a
    file linked under a second name was trained on twice (and counted twice)."""
    data = tmp_path / "corpus"
    (data / "__pycache__").mkdir(parents=True)
    (data / "a.txt").write_text("some text to train on\n" * 40)
    (data / "alias.txt").symlink_to(data / "a.txt")
    (data / "README").write_text("what the corpus is\n" * 40)
    (data / "notes.log").write_text("a log\n" * 40)
    (data / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0" * 64)  # (not the user's)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    assert text_files(data) == [data / "a.txt"]
    check_data(_cfg(data))
    notes = [line for line in capsys.readouterr().err.splitlines() if "skips" in line]
    assert notes == [f"note: data directory {data} holds README, notes.log, which a run on it "
                     "skips: it reads 1 text file of known text suffixes (.txt, .md, .jsonl, "
                     "source code; compressed files are to be decompressed first)"]
