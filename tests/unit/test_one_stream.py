"""Every rank of a run reads the one token stream its launcher checked: each keyed the files
again, and a file written to while the run started (a corpus still being written, an rsync)
gave stage 0 its inputs and the last stage its targets from different streams, silently."""

from __future__ import annotations

import pickle

import pytest

from ratrain.config import RunConfig
from ratrain.data import ByteTokenizer, check_data, make_data
from ratrain.data import tokens as tokens_module
from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.training import agreed_plan


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _cfg(path) -> RunConfig:
    cfg = RunConfig(model=get_preset("tiny"))
    cfg.data.path = str(path)
    cfg.train.steps, cfg.train.seq_len, cfg.train.global_batch = 2, 16, 2
    cfg.train.micro_batch_size, cfg.train.eval_batches, cfg.data.val_fraction = 1, 0, 0.0
    return cfg


def _growing(tmp_path):
    corpus = tmp_path / "grow"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog " * 40)
    return corpus


def _append(corpus) -> None:
    with open(corpus / "a.txt", "a") as f:
        f.write("line 1 appended\n" * 5)


def test_a_rank_reads_the_stream_checked_though_the_files_changed_since(tmp_path):
    corpus = _growing(tmp_path)
    cfg = _cfg(corpus)
    stream = check_data(cfg)
    checked = len(make_data(cfg, ByteTokenizer(), 1, 0, stream=stream)[0].tokens)
    _append(corpus)  # after the launcher's check, before the ranks make their data
    handed = pickle.loads(pickle.dumps(stream))  # as launch_local hands it to its ranks
    assert len(make_data(cfg, ByteTokenizer(), 1, 0, stream=handed)[0].tokens) == checked
    # a rank's own read (none handed), as each made its data until 2026-12-03
    assert len(make_data(cfg, ByteTokenizer(), 1, 0)[0].tokens) == checked + 16 * 5


def test_a_nodes_other_ranks_wait_for_no_entry_of_their_own(tmp_path, monkeypatch):
    """Under torchrun they keyed the files themselves and waited for that entry, which their
    node's first rank, having keyed them before they changed, never wrote."""
    def waited(*args, **kwargs):
        raise AssertionError("a node's other rank waited for a cache entry")

    monkeypatch.setattr(tokens_module, "_wait_for", waited)
    cfg = _cfg(_growing(tmp_path))
    assert check_data(cfg, first_here=False, first=False) is None
    assert not (tmp_path / "cache" / "tokens").exists()  # nor tokenized


def _world(monkeypatch, streams, local_rank):
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(agreed_plan, "gathered_at_start", lambda mine, action: streams(mine))


def test_under_torchrun_a_rank_takes_its_node_first_ranks_stream(tmp_path, monkeypatch):
    corpus = _growing(tmp_path)
    first = _cfg(corpus)
    stream = check_data(first)
    checked = len(make_data(first, ByteTokenizer(), 1, 0, stream=stream)[0].tokens)
    mine = [None]
    _world(monkeypatch, lambda m: mine.__setitem__(0, m) or [m, m], 0)
    assert agreed_plan.agreed_stream(first, 0, stream) == stream  # (node 0's first rank)
    _append(corpus)
    other = _cfg(corpus)
    _world(monkeypatch, lambda m: [mine[0], m], 1)
    taken = agreed_plan.agreed_stream(other, 1, check_data(other, first_here=False, first=False))
    assert len(make_data(other, ByteTokenizer(), 1, 0, stream=taken)[0].tokens) == checked


def test_under_torchrun_nodes_that_read_different_streams_are_refused(tmp_path, monkeypatch):
    corpus = _growing(tmp_path)
    node0 = _cfg(corpus)
    stream0 = check_data(node0)
    _append(corpus)
    node1 = _cfg(corpus)
    stream1 = check_data(node1)
    theirs = [None]
    _world(monkeypatch, lambda m: theirs.__setitem__(0, m) or [m, m], 0)
    agreed_plan.agreed_stream(node1, 1, stream1)  # (node 1's first rank, agreeing with itself)
    _world(monkeypatch, lambda m: [m, theirs[0]], 0)
    with pytest.raises(UserError) as e:
        agreed_plan.agreed_stream(node0, 0, stream0)
    said = str(e.value)
    assert said.startswith("the data changed while the run started: ")
    assert f"--data {corpus}" in said and "\n" not in said
