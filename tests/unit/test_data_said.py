"""What the data layer says to a user, and what it refuses: an empty data path or tokenizer,
tokenizer files that are none, the start line of what a run reads, text that is mostly
undecodable bytes, a tokenizer without an end-of-document token, and vocabularies that do not
match the model's."""

from __future__ import annotations

import numpy as np
import pytest

from ratrain.config import RunConfig
from ratrain.data import ByteTokenizer, check_data, check_fits, load_tokenizer, text_files
from ratrain.data import corpus
from ratrain.errors import UserError
from ratrain.models.presets import get_preset

from .cli_runner import run_cli, small_config

WHAT = "--tokenizer takes 'byte'"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "env-cache"))


def _cfg(path, tokenizer="byte", steps=3, vocab=None) -> RunConfig:
    cfg = RunConfig(model=get_preset("tiny"))
    cfg.data.path, cfg.data.tokenizer = (None if path is None else str(path)), str(tokenizer)
    cfg.train.steps, cfg.train.seq_len, cfg.train.global_batch = steps, 16, 4
    cfg.train.eval_batches = 0
    if vocab:
        cfg.model.vocab_size = vocab
    return cfg


def test_an_empty_data_path_is_refused_not_the_current_directory(tmp_path, monkeypatch):
    """Path("") is ".": `--data ""` trained on whatever the directory the run started in held
    (here a run directory's metrics.jsonl, refused as a bad .jsonl)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("text that is not meant to be trained on\n" * 50)
    for empty in ("", "  "):
        with pytest.raises(UserError, match="data path is empty"):
            text_files(empty)
        with pytest.raises(UserError, match="data path is empty"):
            check_data(_cfg(empty))


def test_train_and_the_tokenizer_command_refuse_an_empty_data_path(tmp_path, monkeypatch,
                                                                  capsys):
    """`ratrain tokenizer --data ""` trained on the standard library, as if --data were out."""
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           "--data", "", "--no-progress", "--run-dir", str(tmp_path / "run"))
    assert code != 0 and "data path is empty" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code, _, err = run_cli(monkeypatch, capsys, "tokenizer", "--data", "", "--out",
                           str(tmp_path / "t/"))
    assert code != 0 and "data path is empty" in err
    assert not (tmp_path / "t" / "tokenizer.json").exists()


def test_the_tokenizer_command_says_one_file_not_one_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.txt").write_text("some words to learn merges from\n" * 40)
    code, out, _ = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(tmp_path / "a.txt"),
                           "--vocab-size", "300", "--out", str(tmp_path / "t/"))
    assert code == 0 and "trained on 1 file;" in out and "trained on 1 files" not in out


@pytest.mark.parametrize("content, what", [
    (b"", "is empty"),
    (b"  \n", "is empty"),
    (np.arange(5000, dtype=np.uint16).tobytes(), "is a binary file"),
    (b"plain text, no JSON", "cannot parse tokenizer"),
])
def test_a_tokenizer_file_that_is_none_says_what_one_must_be(tmp_path, content, what):
    """A .bin of ids or an empty file given as --tokenizer said only the UTF-8 codec's byte
    position or the JSON parser's column."""
    path = tmp_path / "tok.bin"
    path.write_bytes(content)
    with pytest.raises(UserError, match=what) as e:
        load_tokenizer(str(path))
    assert WHAT in str(e.value) and "tokenizer.json" in str(e.value)


def test_an_empty_tokenizer_is_refused_not_a_tokenizer_json_looked_for_here(tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="tokenizer is empty") as e:
        load_tokenizer("")
    assert WHAT in str(e.value)


def test_the_run_start_says_what_data_it_reads(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("hello world, some text.\n" * 40)  # 960 tokens + eos
    check_data(_cfg(tmp_path / "one.txt", steps=3), progress=True)
    err = capsys.readouterr().err
    # the training split: 913 of the 961 tokens, 57 sequences of 16 + 1; 3 steps of 4 of them
    line = (f"data {tmp_path / 'one.txt'}: 1 file, 961 tokens; 0.211 epochs of its training "
            "split in 3 steps")
    assert line in err.splitlines()
    (tmp_path / "two.txt").write_text("more text\n" * 100)
    check_data(_cfg(tmp_path, steps=1), progress=True)
    assert f"data {tmp_path}: 2 files, 1,962 tokens;" in capsys.readouterr().err
    check_data(_cfg(tmp_path / "one.txt"), progress=False)
    assert "data " not in capsys.readouterr().err  # --no-progress


def test_a_pretokenized_file_is_said_as_one_file(tmp_path, capsys):
    np.arange(500, dtype=np.uint16).tofile(tmp_path / "ids.bin")
    check_data(_cfg(tmp_path / "ids.bin", steps=57), progress=True)
    assert f"data {tmp_path / 'ids.bin'}: 1 file, 500 tokens; 7.86 epochs" in (
        capsys.readouterr().err)


def test_a_file_of_mostly_undecodable_bytes_is_warned_of(tmp_path, capsys):
    """A binary file given as text trained, silently, on its U+FFFD and control characters."""
    blob = tmp_path / "tokens.dat"
    blob.write_bytes(np.random.default_rng(0).integers(128, 256, 4000, dtype=np.uint8).tobytes())
    ids = tmp_path / "ids.dat"  # small ids: their bytes are NUL and ASCII, no U+FFFD
    np.arange(2000, dtype=np.uint16).tofile(ids)
    text = tmp_path / "text.txt"
    text.write_text("plain text with a replacement character \ufffd in it\n" * 20)
    for path in (blob, ids, text):
        list(corpus.documents(path))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"warning: {blob}: ") and lines[1].startswith(f"warning: {ids}: ")
    assert "% of its characters are U+FFFD" in lines[0]


def test_the_standard_librarys_files_in_other_encodings_are_not_warned_of(tmp_path, monkeypatch,
                                                                           capsys):
    """The default corpus holds codecs' test modules (test/encoded_modules/module_koi8_r.py):
    the default run warned that one was most likely not text."""
    koi8 = tmp_path / "test" / "module_koi8_r.py"
    koi8.parent.mkdir()
    koi8.write_bytes("# -*- coding: koi8-r -*-\nS = 'Питон'\n".encode("koi8-r") * 20
                     + bytes(range(192, 256)) * 20)
    list(corpus.documents(koi8))
    assert "warning" in capsys.readouterr().err  # outside the standard library: warned of
    monkeypatch.setattr(corpus, "stdlib_root", lambda: tmp_path)
    list(corpus.documents(koi8))
    assert capsys.readouterr().err == ""


def _no_eos_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello world"] * 20, trainers.BpeTrainer(
        vocab_size=270, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(str(tmp_path / "noeos.json"))
    return tmp_path / "noeos.json"


def test_a_tokenizer_without_end_of_document_is_noted_where_documents_are_joined(tmp_path,
                                                                                 capsys):
    tok = _no_eos_tokenizer(tmp_path)
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    for name in ("a.txt", "b.txt"):
        (corpus_dir / name).write_text("hello world, this is a document\n" * 30)
    check_data(_cfg(corpus_dir, tok))
    assert "has no end-of-document token" in capsys.readouterr().err
    check_data(_cfg(corpus_dir / "a.txt", tok))  # one document: nothing is joined
    check_data(_cfg(corpus_dir, "byte"))
    check_data(_cfg(corpus_dir, tok), first=False)  # another rank than the run's first
    assert "end-of-document" not in capsys.readouterr().err


def test_a_tokenizer_larger_than_the_model_names_both_sizes_and_what_to_change():
    with pytest.raises(UserError) as e:
        check_fits(ByteTokenizer(), 256)
    msg = str(e.value)
    assert "257 tokens" in msg and "vocabulary is 256" in msg and "model.vocab_size" in msg
    assert "--vocab-size 256" not in msg  # no byte-level BPE is that small

    class Big:
        vocab_size = 40_000

        def __str__(self):
            return "big/tokenizer.json"

    with pytest.raises(UserError, match="ratrain tokenizer --vocab-size 32000"):
        check_fits(Big(), 32_000)


def test_a_model_vocabulary_far_larger_than_the_tokenizers_is_noted(tmp_path, capsys):
    from ratrain.data.tokenizer import unused_vocab_note

    assert unused_vocab_note(ByteTokenizer(), 512) is None  # the default run
    note = unused_vocab_note(ByteTokenizer(), 32_000)
    assert "257 tokens" in note and "32,000" in note and "ids 257-31,999 never occur" in note
    (tmp_path / "a.txt").write_text("hello world\n" * 80)
    check_data(_cfg(tmp_path / "a.txt", vocab=2048), progress=True)
    assert "ids 257-2,047 never occur" in capsys.readouterr().err
    check_data(_cfg(tmp_path / "a.txt", vocab=2048))  # --no-progress
    assert "never occur" not in capsys.readouterr().err
