"""Data as users have it (test_data.py holds the layer's main paths): suffixes in capitals, files
that share names, sizes and mtimes, corpora with no text, CRLF line ends, special tokens' text
inside documents, lone surrogate escapes, empty vocabularies, .jsonl lines that are wrong."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from ratrain.config import DataConfig
from ratrain.data import ByteTokenizer, HFTokenizer, load_tokens, train_bpe
from ratrain.data import corpus
from ratrain.data.tokens import check_token_ids
from ratrain.errors import UserError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "env-cache"))


def _tokens(path, tok=None):
    return load_tokens(DataConfig(path=str(path)), tok or ByteTokenizer(), progress=False)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    (out / "text.txt").write_text("a b c <|endoftext|> héllo 🚀 emoji\n" * 20)
    return train_bpe([out / "text.txt"], 300, out / "tokenizer.json")


def test_bin_suffixes_in_any_case_and_a_directory_named_bin(tmp_path):
    """`UP.BIN` was decoded as UTF-8 text and trained on; a directory `x.bin/` was "not
    found"."""
    ids = np.array([1, 70_000, 3], dtype=np.uint32)
    ids.tofile(tmp_path / "UP.U32.BIN")
    ids.astype(np.uint16).tofile(tmp_path / "Small.U16.Bin")
    assert _tokens(tmp_path / "UP.U32.BIN").tolist() == ids.tolist()
    small = _tokens(tmp_path / "Small.U16.Bin")
    assert small.dtype == np.uint16
    check_token_ids(small, 128_256, str(tmp_path / "Small.U16.Bin"))  # uint16 meant
    (tmp_path / "x.bin").mkdir()
    (tmp_path / "x.bin" / "a.txt").write_text("a corpus")
    assert _text_of(tmp_path / "x.bin") == b"a corpus"
    from ratrain.data.tokens import is_token_file  # check_data's test

    assert not is_token_file(tmp_path / "x.bin") and is_token_file(tmp_path / "UP.U32.BIN")


def _text_of(path) -> bytes:
    return bytes(_tokens(path)[:-1].astype(np.uint8))


def test_files_of_the_same_names_sizes_and_mtimes_share_no_cache_entry(tmp_path):
    """The key was the path below the corpus root, size and mtime: `cp -p`, or archives of
    fixed mtimes, gave another corpus's tokens."""
    for name, text in (("one", "first corpus\n"), ("two", "other corpus\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text(text)
        os.utime(tmp_path / name / "a.txt", ns=(10**18, 10**18))
    assert _text_of(tmp_path / "one") == b"first corpus\n"
    assert _text_of(tmp_path / "two") == b"other corpus\n"


def test_a_rewrite_of_the_same_size_and_mtime_is_tokenized_anew(tmp_path):
    (tmp_path / "a.txt").write_text("first text\n")
    os.utime(tmp_path / "a.txt", ns=(10**18, 10**18))
    assert _text_of(tmp_path / "a.txt") == b"first text\n"
    time.sleep(0.02)  # past the kernel's timestamp tick: the ctime must move
    (tmp_path / "a.txt").write_text("other text\n")
    os.utime(tmp_path / "a.txt", ns=(10**18, 10**18))
    assert _text_of(tmp_path / "a.txt") == b"other text\n"


@pytest.mark.parametrize("make, needle", [
    (lambda d: [(d / f"{i}.txt").write_text("") for i in range(5)],
     r"the corpus \(5 files\) holds no text"),
    (lambda d: (d / "e.jsonl").write_text('{"text": ""}\n' * 3), r"e.jsonl holds no text"),
    (lambda d: (d / "e.txt").write_text(""), r"e.txt holds no text"),
])
def test_a_corpus_of_no_text_is_refused(tmp_path, make, needle):
    """Each empty document added its end-of-document id, so the run trained on those alone
    (and an empty file said "the training split has 1 tokens")."""
    (tmp_path / "d").mkdir()
    make(tmp_path / "d")
    with pytest.raises(UserError, match=needle):
        _tokens(tmp_path / "d")


def test_line_ends_are_the_files(tmp_path, monkeypatch):
    """CRLF and CR were read as LF (universal newlines); a piece is cut after an LF, never
    between a CR and its LF, after a CR where a piece has no LF."""
    text = "crlf line\r\n" * 30 + "cr\r" * 40 + "end"
    (tmp_path / "c.txt").write_bytes(text.encode())
    assert _text_of(tmp_path / "c.txt") == text.encode()
    monkeypatch.setattr(corpus, "CHUNK_CHARS", 10)  # the first piece ends "crlf line\r"
    pieces = [t for t, _ in corpus.documents(tmp_path / "c.txt")]
    assert "".join(pieces) == text and len(pieces) > 30
    assert not any(a.endswith("\r") and b.startswith("\n") for a, b in zip(pieces, pieces[1:]))
    # after the last LF, else the last CR, else anywhere ("crlf line" of "crlf line\r")
    assert all(p.endswith("\n") if "\n" in p else p.endswith("\r") or "\r" not in p
               for p in pieces[:-1])
    assert pieces[0] == "crlf line" and "cr\rcr\rcr\r" in pieces
    (tmp_path / "c.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "a\\r\\nb"}\r\n{"text": "c"}\r\n')
    assert list(corpus.documents(tmp_path / "c.jsonl")) == [("a\r\nb", True), ("c", True)]


def test_a_special_tokens_text_in_a_document_is_text(bpe):
    """`<|endoftext|>` inside a document was encoded as the end-of-document id."""
    assert bpe.eos_id is not None
    for ids in (bpe.encode("a <|endoftext|> b"), bpe.encode_batch(["a <|endoftext|> b"])[0]):
        assert bpe.eos_id not in list(ids) and bpe.decode(ids) == "a <|endoftext|> b"


def test_lone_surrogate_escapes_are_u_fffd(tmp_path, bpe):
    """Scraped .jsonl holds halves of emoji escapes: UnicodeEncodeError (byte tokenizer),
    TypeError (Hugging Face's), also in `ratrain tokenizer --data`."""
    (tmp_path / "s.jsonl").write_text('{"text": "broken emoji \\ud83d end"}\n'
                                      '{"text": "whole \\ud83d\\ude80"}\n')
    assert [t for t, _ in corpus.documents(tmp_path / "s.jsonl")] == [
        "broken emoji \ufffd end", "whole 🚀"]
    tokens = _tokens(tmp_path / "s.jsonl")
    assert "broken emoji \ufffd end" in ByteTokenizer().decode(tokens.tolist())
    assert bpe.decode(_tokens(tmp_path / "s.jsonl", bpe).tolist()).startswith("broken emoji \ufffd")
    assert ByteTokenizer().encode("x\udc80") == list("x\ufffd".encode())
    assert bpe.decode(bpe.encode_batch(["x\udc80"])[0]) == "x\ufffd"
    train_bpe([tmp_path / "s.jsonl"], 300, tmp_path / "t.json")


def test_a_tokenizer_of_no_vocabulary_is_refused(tmp_path, bpe):
    blob = json.loads(bpe.path.read_text())
    blob["added_tokens"], blob["model"]["vocab"], blob["model"]["merges"] = [], {}, []
    (tmp_path / "tokenizer.json").write_text(json.dumps(blob))
    with pytest.raises(UserError, match=r"tokenizer .*tokenizer.json has an empty vocabulary"):
        HFTokenizer(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("line, needle", [
    ('{"text": 123}', r"this one's \"text\" is a number"),
    ('{"text": null}', r"this one's \"text\" is null"),
    ('{"text": ["a"]}', r"this one's \"text\" is an array"),
    ('["text"]', r"this one is an array"),
    ('{"content": "x"}', r"this one has keys content"),
    ('{"text": "a\tb"}', r"j.jsonl:2: not JSON \(Invalid control character at column 12\)"),
])
def test_a_jsonl_line_without_a_text_string_says_what_it_holds(tmp_path, line, needle):
    (tmp_path / "j.jsonl").write_text('{"text": "ok"}\n' + line + "\n")
    with pytest.raises(UserError, match=needle):
        list(corpus.documents(tmp_path / "j.jsonl"))


def test_a_jsonl_opening_with_a_bom_is_read(tmp_path):
    """It was refused with Python's "decode using utf-8-sig"."""
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "bom"}\n{"text": "\xef\xbb\xbfkept"}\n')
    assert [t for t, _ in corpus.documents(tmp_path / "b.jsonl")] == ["bom", "\ufeffkept"]
