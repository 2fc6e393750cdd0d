"""Data layer: corpus, tokenizers, token cache, deterministic loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ratrain.config import DataConfig
from ratrain.data import (
    ByteTokenizer,
    MicroBatchLoader,
    check_fits,
    check_token_ids,
    eval_batches,
    load_tokenizer,
    load_tokens,
    split_train_val,
    stdlib_files,
    stdlib_root,
    text_files,
    train_bpe,
)
from ratrain.errors import UserError

SEQ = 16


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    # Never read or write the user's ~/.cache/ratrain.
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "env-cache"))


@pytest.fixture
def text_dir(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    (d / "b.txt").write_text("second file\n")
    (d / "a.md").write_text("# first\nnon-ASCII: héllo wörld — 世界\n")
    (d / "sub" / "c.py").write_text("print('third')\n")
    (d / "image.png").write_bytes(b"\x89PNG")
    (d / ".hidden" / "x.txt").write_text("skipped")
    return d


# corpus -----------------------------------------------------------------------------------


def test_stdlib_corpus_sorted_deterministic_without_site_packages():
    files = stdlib_files()
    root = stdlib_root()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert len(files) > 100
    assert rel == sorted(rel)
    assert files == stdlib_files()
    assert all(f.suffix == ".py" for f in files)
    assert not any({"site-packages", "dist-packages"} & set(r.split("/")) for r in rel)
    assert "os.py" in rel


def test_text_files_of_a_directory(text_dir):
    rel = [f.relative_to(text_dir).as_posix() for f in text_files(text_dir)]
    assert rel == ["a.md", "b.txt", "sub/c.py"]
    assert text_files(text_dir / "b.txt") == [text_dir / "b.txt"]


def test_missing_or_empty_data_path(tmp_path):
    with pytest.raises(UserError, match="data path not found"):
        text_files(tmp_path / "nope")
    with pytest.raises(UserError, match="data path not found"):
        load_tokens(DataConfig(path=str(tmp_path / "nope")), ByteTokenizer())
    with pytest.raises(UserError, match="data path not found"):
        load_tokens(DataConfig(path=str(tmp_path / "nope.bin")), ByteTokenizer())
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no text files"):
        text_files(tmp_path / "empty")


# tokenizers -------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip():
    tok = load_tokenizer("byte")
    text = "def f():\n    return 'héllo — 世界 🚀'\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_id]) == text
    assert (tok.vocab_size, tok.eos_id, tok.name) == (257, 256, "byte")
    assert np.array_equal(tok.encode_batch([text])[0], ids)


def test_hf_bpe_train_load_round_trip(tmp_path):
    out = tmp_path / "tok" / "tokenizer.json"
    trained = train_bpe(stdlib_files()[:5], 300, out)
    tok = load_tokenizer(str(out.parent))
    assert tok.name == trained.name and tok.name.startswith("hf:")
    assert tok.vocab_size == 300
    assert tok.eos_id == 0  # special tokens come first in a trained vocabulary
    text = "import os\n\ndef main():\n    print('héllo 世界')\n"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode())  # merges were learned
    assert max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    assert list(tok.encode_batch([text])[0]) == ids


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(UserError, match="tokenizer not found"):
        load_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="tokenizer not found"):
        load_tokenizer(str(tmp_path))  # a directory without tokenizer.json
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="cannot parse tokenizer"):
        load_tokenizer(str(bad))
    with pytest.raises(UserError, match="vocab_size >= 257"):
        train_bpe([bad], 100, tmp_path / "t.json")


def test_check_fits():
    check_fits(ByteTokenizer(), 257)
    check_fits(ByteTokenizer(), 512)
    msg = "tokenizer 'byte' has 257 tokens but the model's vocabulary is 256"
    with pytest.raises(UserError, match=msg):
        check_fits(ByteTokenizer(), 256)


def test_a_tokenizer_too_large_for_weights_offers_only_a_smaller_tokenizer():
    """A model from a Hugging Face directory has its weights' vocabulary: the refusal offered a
    larger model.vocab_size in a --config, which the directory's config.json replaces."""
    with pytest.raises(UserError) as refused:
        check_fits(ByteTokenizer(), 256, "/w/hf")
    assert str(refused.value) == ("tokenizer 'byte' has 257 tokens but the model's vocabulary "
                                  "is 256, fixed by the weights in /w/hf: use a tokenizer of at "
                                  "most 256 tokens")


# token streams ----------------------------------------------------------------------------


def test_load_tokens_joins_documents_with_eos(text_dir, tmp_path):
    tok = ByteTokenizer()
    cfg = DataConfig(path=str(text_dir), cache_dir=str(tmp_path / "c"))
    tokens = load_tokens(cfg, tok, progress=False)
    expected = []
    for f in text_files(text_dir):
        expected += list(f.read_bytes()) + [tok.eos_id]
    assert tokens.dtype == np.uint16
    assert not tokens.flags.writeable
    assert tokens.tolist() == expected


def test_a_long_file_is_read_and_tokenized_in_pieces(tmp_path, monkeypatch):
    """A text file is read CHUNK_CHARS at a time, cut after a newline (or anywhere, where a
    piece has none), so that neither it nor its tokens sit in memory whole; the bytes are the
    file's, one end-of-document id after its last piece."""
    from ratrain.data import corpus

    monkeypatch.setattr(corpus, "CHUNK_CHARS", 50)
    text = "".join(f"line {i} of a long file, héllo\n" for i in range(40)) + "x" * 170
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "long.txt").write_text(text)
    pieces = list(corpus.documents(tmp_path / "d" / "long.txt"))
    assert "".join(t for t, _ in pieces) == text and len(pieces) > 20
    assert [ends for _, ends in pieces] == [False] * (len(pieces) - 1) + [True]
    assert all(len(t) <= 2 * corpus.CHUNK_CHARS for t, _ in pieces)
    assert all(t.endswith("\n") for t, _ in pieces[:-5])  # cut after newlines where there are
    tok = ByteTokenizer()
    tokens = load_tokens(DataConfig(path=str(tmp_path / "d"), cache_dir=str(tmp_path / "c")), tok,
                         progress=False)
    assert tokens.tolist() == list(text.encode()) + [tok.eos_id]


def test_a_jsonl_file_is_its_records_text_each_a_document(tmp_path):
    """The Hugging Face datasets' layout: one JSON object a line, its "text" the document (it
    was tokenized as raw JSON, keys and escapes included, one document a file)."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "shard.jsonl").write_text(
        '{"text": "first doc\\nwith a newline", "id": 1}\n\n{"text": "second"}\n')
    tok = ByteTokenizer()
    tokens = load_tokens(DataConfig(path=str(tmp_path / "d"), cache_dir=str(tmp_path / "c")), tok,
                         progress=False)
    assert tokens.tolist() == (list(b"first doc\nwith a newline") + [tok.eos_id]
                               + list(b"second") + [tok.eos_id])
    (tmp_path / "d" / "shard.jsonl").write_text('{"text": "ok"}\n{"content": "no text"}\n')
    with pytest.raises(UserError, match=r"shard.jsonl:2: a .jsonl line needs a \"text\" "
                                        r"string \(this one has keys content\)"):
        load_tokens(DataConfig(path=str(tmp_path / "d"), cache_dir=str(tmp_path / "c")), tok,
                    progress=False)
    (tmp_path / "d" / "shard.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(UserError, match=r"shard.jsonl:2: not JSON"):
        load_tokens(DataConfig(path=str(tmp_path / "d"), cache_dir=str(tmp_path / "c")), tok,
                    progress=False)


def test_token_cache_is_reused(text_dir, tmp_path, monkeypatch):
    cfg = DataConfig(path=str(text_dir), cache_dir=str(tmp_path / "c"))
    tok = ByteTokenizer()
    first = np.array(load_tokens(cfg, tok, progress=False))

    def boom(texts):
        raise AssertionError("re-tokenized despite a valid cache")

    monkeypatch.setattr(tok, "encode_batch", boom)
    assert np.array_equal(load_tokens(cfg, tok, progress=False), first)
    cached = sorted((tmp_path / "c" / "tokens").iterdir())  # the stream, and its findings
    assert [p.suffix for p in cached] == [".bin", ".undecodable"]
    # An edited file changes the key, so the stale stream is not used.
    (text_dir / "b.txt").write_text("second file, edited\n")
    with pytest.raises(AssertionError, match="re-tokenized"):
        load_tokens(cfg, tok, progress=False)


def test_crashed_tokenization_leaves_no_cache(text_dir, tmp_path, monkeypatch):
    cfg = DataConfig(path=str(text_dir), cache_dir=str(tmp_path / "c"))
    tok = ByteTokenizer()

    def crash(texts):
        raise KeyboardInterrupt

    monkeypatch.setattr(tok, "encode_batch", crash)
    with pytest.raises(KeyboardInterrupt):
        load_tokens(cfg, tok, progress=False)
    assert list((tmp_path / "c" / "tokens").iterdir()) == []


def test_a_killed_runs_partial_stream_is_removed_by_the_next_tokenization(text_dir, tmp_path):
    """A SIGKILL leaves the temporary stream behind (an exception removes its own); the next
    tokenization into that cache removes one nobody wrote to for a day, and leaves a recent
    one: another run may be writing it."""
    import os
    import time

    tokens = tmp_path / "c" / "tokens"
    tokens.mkdir(parents=True)
    old, recent = tokens / ".tmp-killed.part", tokens / ".tmp-writing.part"
    old.write_bytes(b"\0" * 64)
    recent.write_bytes(b"\0" * 64)
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    load_tokens(DataConfig(path=str(text_dir), cache_dir=str(tmp_path / "c")), ByteTokenizer(),
                progress=False)
    assert not old.exists() and recent.exists()


def test_cache_dir_from_environment(text_dir, tmp_path):
    load_tokens(DataConfig(path=str(text_dir)), ByteTokenizer(), progress=False)
    cached = sorted((tmp_path / "env-cache" / "tokens").iterdir())
    assert [p.suffix for p in cached] == [".bin", ".undecodable"]


def test_hf_tokens_decode_back(text_dir, tmp_path):
    tok = train_bpe(text_files(text_dir), 300, tmp_path / "tokenizer.json")
    tokens = load_tokens(DataConfig(path=str(text_dir)), tok, progress=False)
    docs = tok.decode(tokens.tolist()).split("<|endoftext|>")
    assert docs == [f.read_text() for f in text_files(text_dir)] + [""]


def test_full_stdlib_with_byte_tokenizer(tmp_path):
    tokens = load_tokens(DataConfig(cache_dir=str(tmp_path)), ByteTokenizer(), progress=False)
    assert len(tokens) > 1_000_000
    assert int((tokens == 256).sum()) == len(stdlib_files())
    assert tokens[-1] == 256


@pytest.mark.parametrize("name, dtype", [("t.bin", np.uint16), ("t.u32.bin", np.uint32)])
def test_pretokenized_bin(tmp_path, name, dtype):
    ids = np.arange(0, 70_000 if dtype == np.uint32 else 60_000, 7).astype(dtype)
    path = tmp_path / name
    ids.tofile(path)
    tokens = load_tokens(DataConfig(path=str(path)), ByteTokenizer())
    assert tokens.dtype == dtype
    assert np.array_equal(tokens, ids)
    check_token_ids(tokens, int(ids.max()) + 1)
    with pytest.raises(UserError, match=f"holds id {ids.max()}"):
        check_token_ids(tokens, int(ids.max()))


def test_a_plain_bin_for_a_vocabulary_above_uint16_is_refused(tmp_path):
    """Llama 3's ids stored as uint32 in `train.bin` read back as uint16 halves, all below
    65,536: every other check passed and the run trained on garbage."""
    ids = np.array([100_000, 128_000, 5], dtype=np.uint32)
    ids.tofile(tmp_path / "train.bin")
    tokens = load_tokens(DataConfig(path=str(tmp_path / "train.bin")), ByteTokenizer())
    assert tokens.tolist() == [34464, 1, 62464, 1, 5, 0]  # what it was read as
    with pytest.raises(UserError, match=r"train.bin is read as uint16 ids .* 128,256 words"):
        check_token_ids(tokens, 128_256, str(tmp_path / "train.bin"))
    ids.tofile(tmp_path / "train.u32.bin")
    check_token_ids(load_tokens(DataConfig(path=str(tmp_path / "train.u32.bin")),
                                ByteTokenizer()), 128_256, str(tmp_path / "train.u32.bin"))
    ids.astype(np.uint16).tofile(tmp_path / "small.u16.bin")  # uint16 meant: said so
    check_token_ids(load_tokens(DataConfig(path=str(tmp_path / "small.u16.bin")),
                                ByteTokenizer()), 128_256, str(tmp_path / "small.u16.bin"))


def test_linked_directories_are_followed_once(text_dir, tmp_path):
    """A corpus of links to its shards' directories lost them all; a link back up ends."""
    shards = tmp_path / "shards" / "s1"
    shards.mkdir(parents=True)
    (shards / "d.txt").write_text("linked shard\n")
    (text_dir / "s1").symlink_to(shards, target_is_directory=True)
    (shards / "up").symlink_to(text_dir, target_is_directory=True)
    names = [f.relative_to(text_dir).as_posix() for f in text_files(text_dir)]
    assert names == ["a.md", "b.txt", "s1/d.txt", "sub/c.py"]


def test_a_rank_that_does_not_tokenize_waits_for_the_one_that_does(text_dir, tmp_path):
    """Under torchrun a node's first rank tokenizes; the others wait for its cache file rather
    than each write a whole second stream."""
    import threading

    cfg = DataConfig(path=str(text_dir), cache_dir=str(tmp_path / "c"))
    tok = ByteTokenizer()
    later = threading.Timer(0.5, load_tokens, (cfg, tok), {"progress": False})
    later.start()
    waited = load_tokens(cfg, tok, progress=False, tokenize=False)
    later.join()
    assert waited.tolist() == load_tokens(cfg, tok, progress=False).tolist()
    cached = sorted((tmp_path / "c" / "tokens").iterdir())  # one stream, and its findings
    assert [p.suffix for p in cached] == [".bin", ".undecodable"]


def test_bad_bin_files(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(UserError, match="is empty"):
        load_tokens(DataConfig(path=str(tmp_path / "empty.bin")), ByteTokenizer())
    (tmp_path / "odd.u32.bin").write_bytes(b"\x00" * 6)
    with pytest.raises(UserError, match="not a whole number"):
        load_tokens(DataConfig(path=str(tmp_path / "odd.u32.bin")), ByteTokenizer())


def test_split_train_val():
    tokens = np.arange(1000, dtype=np.uint16)
    train, val = split_train_val(tokens, 0.1)
    assert (len(train), len(val)) == (900, 100)
    assert np.array_equal(np.concatenate([train, val]), tokens)
    assert np.shares_memory(train, tokens) and np.shares_memory(val, tokens)
    assert len(split_train_val(tokens, 0.0)[1]) == 0
    with pytest.raises(UserError, match="val_fraction"):
        split_train_val(tokens, 1.0)


# loader -----------------------------------------------------------------------------------


def _stream(n_windows):
    # Token i has value i, so a window is recognised by its first input token.
    return np.arange(n_windows * SEQ + 1, dtype=np.uint16)


def _global(batches):
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def _windows(batches):
    return (_global(batches)[0][:, 0] // SEQ).tolist()


def test_micro_batch_shapes_and_targets():
    loader = MicroBatchLoader(_stream(50), SEQ, global_batch=8, micro_batch_size=2)
    batches = loader.step_batches(0)
    assert loader.n_micro == len(batches) == 4
    for x, y in batches:
        assert x.shape == y.shape == (2, SEQ)
        assert x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(y, x + 1)  # targets are the inputs shifted by one token
        assert torch.all(x[:, 0] % SEQ == 0)  # windows start on stride boundaries


def test_loader_is_deterministic_per_seed():
    def at(seed, step):
        return _global(MicroBatchLoader(_stream(50), SEQ, 8, 2, seed=seed).step_batches(step))[0]

    assert torch.equal(at(0, 3), at(0, 3))
    assert not torch.equal(at(0, 3), at(1, 3))
    assert not torch.equal(at(0, 0), at(0, 1))


def test_resume_matches_uninterrupted_run():
    run = MicroBatchLoader(_stream(50), SEQ, 8, 2, seed=3)
    for _ in range(5):
        next(run)
    state = run.state_dict()
    assert state == {"step": 5, "tokens": len(_stream(50)), "fingerprint": state["fingerprint"]}
    resumed = MicroBatchLoader(_stream(50), SEQ, 8, 2, seed=3)
    resumed.load_state_dict(state)
    for _ in range(10):  # crosses epoch boundaries (50 windows, 8 per step)
        assert _windows(next(run)) == _windows(next(resumed))


def test_the_loaders_state_tells_data_edited_at_the_same_length():
    """A resume compared the token counts alone: an edit in place, or another file of the same
    name, went unnoticed. The fingerprint hashes the stream in pieces (a memmap's tobytes()
    copies it whole): the same as of the whole, other for one id changed."""
    import hashlib

    from ratrain.data.tokens import stream_fingerprint

    tokens = _stream(50)
    state = MicroBatchLoader(tokens, SEQ, 8, 2).state_dict()
    assert state["fingerprint"] == hashlib.sha256(tokens.tobytes()).hexdigest()[:32]
    assert stream_fingerprint(tokens, chunk=7) == state["fingerprint"]
    edited = tokens.copy()
    edited[100] += 1
    assert MicroBatchLoader(edited, SEQ, 8, 2).state_dict()["fingerprint"] != state["fingerprint"]


def test_a_stream_past_the_whole_hash_is_fingerprinted_by_its_length_and_windows(monkeypatch):
    from ratrain.data import tokens as t

    monkeypatch.setattr(t, "WHOLE_HASH_BYTES", 1000)
    monkeypatch.setattr(t, "SAMPLES", 4)
    monkeypatch.setattr(t, "SAMPLE_TOKENS", 10)
    stream = np.arange(3000, dtype=np.uint16)  # windows at 0, 996, 1992, 2988
    base = t.stream_fingerprint(stream)
    inside, between = stream.copy(), stream.copy()
    inside[2990] += 1
    between[500] += 1
    assert t.stream_fingerprint(inside) != base
    assert t.stream_fingerprint(between) == base  # the price of not reading 200 GB
    assert t.stream_fingerprint(stream[:-1]) != base


@pytest.mark.parametrize("mbs", [1, 2])
def test_dp_ranks_concatenate_to_the_global_batch(mbs):
    tokens = _stream(50)
    ref = MicroBatchLoader(tokens, SEQ, 8, mbs, seed=7)
    for dp in (2, 4):
        ranks = [MicroBatchLoader(tokens, SEQ, 8, mbs, dp, r, seed=7) for r in range(dp)]
        assert ranks[0].n_micro == 8 // (dp * mbs)
        for step in range(14):
            merged = [b for rank in ranks for b in rank.step_batches(step)]
            for got, want in zip(_global(merged), _global(ref.step_batches(step))):
                assert torch.equal(got, want)


def test_each_epoch_covers_every_window_once():
    loader = MicroBatchLoader(_stream(48), SEQ, 8, 2, seed=0)
    epochs = [sum((_windows(next(loader)) for _ in range(6)), []) for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(48))
    assert epochs[0] != epochs[1]


def test_loader_rejects_too_little_data():
    with pytest.raises(UserError, match="10 tokens, too few for one sequence of seq_len 16 "
                       r"\(needs 17\); give it more text, or a shorter --seq-len"):
        MicroBatchLoader(np.zeros(10, np.uint16), SEQ, 8, 2)
    with pytest.raises(UserError, match=r"validation split has 3 tokens.*set --eval-batches "
                       r"\(train.eval_batches\) to 0"):
        eval_batches(np.zeros(3, np.uint16), SEQ, 2, 1)
    with pytest.raises(UserError, match="5 sequences .* fewer than one global batch of 8"):
        MicroBatchLoader(_stream(5), SEQ, 8, 2)
    with pytest.raises(UserError, match="does not split into dp=4"):
        MicroBatchLoader(_stream(50), SEQ, 8, 4, dp_size=4)


def test_eval_batches_fixed_whatever_computes_them():
    """The same sequences at every dp and micro-batch size (until 2026-11-29 the set was a
    count of micro-batches: its loss changed with --micro-batch-size)."""
    tokens = _stream(20)
    full = eval_batches(tokens, SEQ, 2, n_sequences=8)
    assert _windows(full) == list(range(8))  # first windows, in order
    assert all(torch.equal(y, x + 1) for x, y in full)
    for dp, mbs in ((1, 1), (1, 4), (2, 1), (2, 2), (4, 2)):
        merged = [b for r in range(dp) for b in eval_batches(tokens, SEQ, mbs, 8, dp, r)]
        assert _windows(merged) == list(range(8)), (dp, mbs)
        assert all(len(x) == mbs for x, _ in merged)
    assert len(eval_batches(tokens, SEQ, 2, n_sequences=100)) == 10  # capped at what exists
    assert _windows(eval_batches(tokens, SEQ, 3, 100, 2, 1)) == list(range(9, 18))  # whole ones
    assert eval_batches(tokens, SEQ, 2, n_sequences=0) == []
    for dp in (2, 3):  # a short split: its whole micro-batches, in uneven shares
        merged = [b for r in range(dp) for b in eval_batches(tokens, SEQ, 3, 100, dp, r)]
        assert _windows(merged) == list(range(18))
    with pytest.raises(UserError, match="fewer than one micro-batch of 4"):
        eval_batches(_stream(3), SEQ, 4, n_sequences=4)
    with pytest.raises(UserError, match="0 tokens, too few"):
        eval_batches(np.zeros(0, np.uint16), SEQ, 2, n_sequences=2)
