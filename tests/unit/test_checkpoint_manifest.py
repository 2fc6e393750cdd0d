"""Checkpoints verified by their manifest: a missing, truncated or altered file is named, the
newest checkpoint that verifies is the one used, only the last K are kept, and a save that fails
(a full disk) leaves the earlier checkpoints as they were."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from ratrain import checkpoint
from ratrain.checkpoint import manifest, store

from .wrapped_file import WrappedFile


def _states(seed: float) -> dict[int, dict]:
    """Two units as the engines give them: weights and an AdamW state dict."""
    out = {}
    for u in (0, 1):
        p = torch.nn.Parameter(torch.full((3, 4), float(seed + u)))
        opt = torch.optim.AdamW([p], lr=1e-3)
        p.grad = torch.ones_like(p)
        opt.step()
        out[u] = {"weights": {"w": p.detach().clone(), "b": torch.arange(4.0) + u},
                  "optim": opt.state_dict()}
    return out


def _save(run_dir, step, keep=2, seed=None):
    files = checkpoint.save_units(run_dir, step, _states(step if seed is None else seed))
    return checkpoint.finalize(run_dir, step, {"config": {}, "loader": {"step": step}, "rng": {}},
                               files, keep)


def test_a_saved_checkpoint_verifies_and_loads_what_was_saved(tmp_path):
    ckpt = _save(tmp_path, 3)
    assert ckpt.name == "step_000003" and manifest.problem(ckpt) is None
    meta = checkpoint.load_meta(ckpt)
    assert meta["step"] == 3 and meta["loader"] == {"step": 3}
    assert set(meta["files"]) == {"unit_0000.safetensors", "unit_0000.optim.pt",
                                  "unit_0001.safetensors", "unit_0001.optim.pt"}
    loaded = checkpoint.load_units(ckpt, [0, 1], "cpu")
    want = _states(3)
    for u in (0, 1):
        assert torch.equal(loaded[u]["weights"]["w"], want[u]["weights"]["w"])
        assert torch.equal(loaded[u]["optim"]["state"][0]["exp_avg"], want[u]["optim"]["state"][0]["exp_avg"])
    assert not list((tmp_path / "checkpoints").glob("*.partial"))


def test_units_are_verified_together_and_read_one_at_a_time(tmp_path, monkeypatch):
    """Every file is checked before any state is read, and a unit's state is read when it is
    asked for, not kept: a resume holds one unit's state at a time (it read all of them at
    once, onto the GPU: 81 GB at llama2-7b). An export leaves the AdamW states unread."""
    ckpt = _save(tmp_path, 3)
    reads = []
    real = checkpoint.read_unit
    monkeypatch.setattr(checkpoint, "read_unit", lambda ckpt, u, *a: reads.append(u) or real(
        ckpt, u, *a))
    states = checkpoint.load_units(ckpt, [0, 1], "cpu")
    assert reads == [] and list(states) == [0, 1] and len(states) == 2
    assert states[1]["optim"] is not None and reads == [1]
    assert [u for u, _ in states.items()] == [0, 1] and reads == [1, 0, 1]
    with pytest.raises(KeyError):
        states[2]
    assert checkpoint.load_units(ckpt, [0], "cpu", optimizer=False)[0]["optim"] is None
    (ckpt / "unit_0001.optim.pt").write_bytes(b"damaged")  # checked before unit 0 is read
    with pytest.raises(checkpoint.CheckpointDamaged, match="unit_0001.optim.pt"):
        checkpoint.load_units(ckpt, [0, 1], "cpu")
    assert reads == [1, 0, 1, 0]
    # an export hashes only what it reads; a resume, whose checkpoint run_dir.resume_point
    # verified whole, hashes nothing again (81 GB a pass at llama2-7b)
    hashed = []
    real_check = manifest.file_problem
    monkeypatch.setattr(manifest, "file_problem", lambda ckpt, name, entry, hashed_too=True: (
        hashed_too and hashed.append(name)) or real_check(ckpt, name, entry, hashed_too))
    assert checkpoint.load_units(ckpt, [0, 1], "cpu", optimizer=False)[1]["optim"] is None
    assert hashed == ["unit_0000.safetensors", "unit_0001.safetensors"]
    assert checkpoint.load_units(ckpt, [0], "cpu", verified=True)
    assert len(hashed) == 2
    with pytest.raises(checkpoint.CheckpointDamaged, match="unit_0001.optim.pt is truncated"):
        checkpoint.load_units(ckpt, [0, 1], "cpu", verified=True)  # sizes: a stat each
    assert len(hashed) == 2


def _flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,needle", [
    (lambda c: (c / "unit_0001.safetensors").unlink(), "unit_0001.safetensors is missing"),
    (lambda c: (c / "unit_0001.optim.pt").write_bytes((c / "unit_0001.optim.pt").read_bytes()[:100]),
     "unit_0001.optim.pt is truncated (100 of "),
    (lambda c: _flip_a_bit(c / "unit_0000.safetensors"),
     "unit_0000.safetensors does not match its sha256"),
    (lambda c: (c / "manifest.json").unlink(), "no manifest.json"),
    (lambda c: (c / "manifest.json").write_text("{\"format\": 1, \"step\": "), "manifest.json is unreadable"),
    (lambda c: (c / "manifest.json").write_text(json.dumps({"format": 1, "step": 4, "files": {
        "../escape": {"bytes": 1, "sha256": "0"}}})), "manifest.json is damaged"),
])
def test_damage_is_named_and_the_newest_good_checkpoint_is_used(tmp_path, damage, needle):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    damage(newest)
    ckpt, skipped = checkpoint.scan(tmp_path)
    assert ckpt.name == "step_000002"
    assert [(p.name, needle in why) for p, why in skipped] == [("step_000004", True)], skipped
    assert checkpoint.latest(tmp_path).name == "step_000002"


def test_loading_a_damaged_unit_by_name_is_a_user_error(tmp_path):
    ckpt = _save(tmp_path, 2)
    _flip_a_bit(ckpt / "unit_0001.optim.pt")
    assert checkpoint.load_units(ckpt, [0], "cpu")  # unit 0's files are intact
    with pytest.raises(checkpoint.CheckpointDamaged, match="unit_0001.optim.pt does not match"):
        checkpoint.load_units(ckpt, [0, 1], "cpu")
    with pytest.raises(checkpoint.CheckpointDamaged, match="has no unit 7"):
        checkpoint.load_units(ckpt, [7], "cpu")


def test_only_the_newest_k_are_kept_and_stale_partials_go(tmp_path):
    (tmp_path / "checkpoints" / "step_000001.partial").mkdir(parents=True)  # a crashed save
    for step in (2, 4, 6, 8):
        _save(tmp_path, step, keep=3)
    names = [p.name for p in sorted((tmp_path / "checkpoints").iterdir())]
    assert names == ["step_000004", "step_000006", "step_000008"]
    # Ordered by step, not by name: step 1000000 is newer than step 999999.
    _save(tmp_path, 999_999, keep=2)
    _save(tmp_path, 1_000_000, keep=2)
    assert [p.name for p in checkpoint.complete_dirs(tmp_path)] == ["step_999999", "step_1000000"]


def test_keep_k_keeps_k_while_the_run_has_fewer_than_k(tmp_path):
    """keep 4 with two saved: the slice from the end (len - keep + 1 < 0) kept one of them."""
    for step in range(1, 7):
        _save(tmp_path, step, keep=4)
        want = list(range(max(1, step - 3), step + 1))
        assert [checkpoint.step_of(p) for p in checkpoint.complete_dirs(tmp_path)] == want


def test_a_disk_that_fills_while_saving_leaves_the_earlier_checkpoints(tmp_path, monkeypatch):
    good = _save(tmp_path, 2)
    real_write = store.write_unit
    calls = []

    def write_then_fill(directory, unit, state, replica=0, outer=True):
        calls.append(unit)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(directory, unit, state, replica, outer)

    monkeypatch.setattr(checkpoint, "write_unit", write_then_fill)
    with pytest.raises(checkpoint.CheckpointWriteError) as e:
        checkpoint.save_units(tmp_path, 4, _states(4))
    assert "could not write checkpoint step_000004" in str(e.value)
    assert "No space left on device" in str(e.value)
    assert "the newest complete checkpoint is step_000002" in str(e.value)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000002"]
    assert manifest.problem(good) is None


def test_a_disk_that_fills_at_a_flush_fails_the_save_and_leaves_the_earlier_checkpoint(
        tmp_path, monkeypatch):
    """Through the real write path (store.write_unit), not a stand-in for it: the disk filling
    where a file is flushed is the save's error, and the earlier checkpoint stays."""
    good = _save(tmp_path, 2)
    real_fsync = store.os.fsync
    flushes = []

    def fsync_then_fill(fd):
        flushes.append(fd)
        if len(flushes) == 3:  # unit 1's weights, after unit 0's two files
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(store.os, "fsync", fsync_then_fill)
    with pytest.raises(checkpoint.CheckpointWriteError, match="No space left on device"):
        checkpoint.save_units(tmp_path, 4, _states(4))
    assert len(flushes) == 3
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000002"]
    assert manifest.problem(good) is None


def test_a_full_disk_under_torch_save_is_the_disks_error_not_torchs(tmp_path, monkeypatch):
    """The AdamW state is serialized straight into its file (store._torch_save); a write that
    fails there comes out of torch as "unexpected pos ..." and is raised as the file's OSError,
    which the save reports with the checkpoint kept intact."""
    good = _save(tmp_path, 2)

    class FillsAfter(WrappedFile):  # a file on a disk with `room` bytes left
        def __init__(self, f, room):
            super().__init__(f)
            self.room = room

        def write(self, data):
            self.room -= len(memoryview(data).cast("B"))
            if self.room < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

    monkeypatch.setattr(store, "open", lambda path, mode: FillsAfter(open(path, mode), 100),
                        raising=False)
    with pytest.raises(OSError) as e:
        store._torch_save({"m": torch.zeros(1000)}, tmp_path / "x.pt")
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(checkpoint.CheckpointWriteError, match="No space left on device"):
        checkpoint.save_units(tmp_path, 4, _states(4))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000002"]
    assert manifest.problem(good) is None


def test_a_manifest_that_cannot_be_written_removes_the_partial(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    files = checkpoint.save_units(tmp_path, 4, _states(4))

    def full(directory, meta):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manifest, "write", full)
    with pytest.raises(checkpoint.CheckpointWriteError, match="step_000004"):
        checkpoint.finalize(tmp_path, 4, {"config": {}}, files, keep=2)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000002"]


def test_the_rank_whose_disk_filled_is_reported_not_the_one_whose_directory_went(tmp_path,
                                                                                  monkeypatch):
    """Rank 1's disk fills and it removes the shared partial directory; rank 0, still writing
    into it, then fails with "no such file" and may report first. The launcher reports the
    earliest failure, so rank 1's is dated when its write failed, before the removal."""
    from ratrain.runtime.worker_errors import first_failure, record_failure

    _save(tmp_path, 2)

    def fails_with(code, text):
        def write(directory, unit, state, replica=0, outer=True):
            raise OSError(code, text)
        return write

    monkeypatch.setattr(checkpoint, "write_unit", fails_with(errno.ENOSPC, "No space left on device"))
    with pytest.raises(checkpoint.CheckpointWriteError) as filled:
        checkpoint.save_units(tmp_path, 4, _states(4))
    monkeypatch.setattr(checkpoint, "write_unit", fails_with(errno.ENOENT, "No such file or directory"))
    with pytest.raises(checkpoint.CheckpointWriteError) as gone:
        checkpoint.save_units(tmp_path, 4, _states(4))
    reports = tmp_path / "errors"
    record_failure(reports, 0, gone.value)  # rank 0's report is written first
    record_failure(reports, 1, filled.value)
    first = first_failure(reports, 0, "")
    assert first.rank == 1 and "No space left on device" in str(first), str(first)


def test_under_torchrun_only_rank_0_hashes_the_checkpoint_a_run_resumes_from(tmp_path,
                                                                             monkeypatch):
    """Every rank of a node hashed the whole checkpoint (81 GB at llama2-7b, 8 times over). Now
    rank 0 alone does; another rank takes the newest whose files are there at their sizes (a
    flipped bit shows only to the hash), and rank 0's choice
    once the world is joined (agreed_plan.agreed_checkpoint; tests/distributed/
    test_resume_torchrun.py runs it)."""
    from ratrain.config import RunConfig
    from ratrain.training.run_dir import resume_point

    _save(tmp_path, 2)
    _flip_a_bit(_save(tmp_path, 4) / "unit_0000.safetensors")
    hashed = []
    real = manifest.digest
    monkeypatch.setattr(manifest, "digest", lambda path: hashed.append(path.name) or real(path))
    for key, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(key, value)
    assert resume_point(tmp_path, RunConfig()).name == "step_000004" and hashed == []
    monkeypatch.setenv("RANK", "0")
    assert resume_point(tmp_path, RunConfig()).name == "step_000002" and hashed


def test_a_damaged_checkpoint_does_not_count_among_the_k_kept(tmp_path):
    """keep 2 with step 4 cut short: saving step 6 kept 4 and 6 and removed 2, the only other
    one a resume could use. Now the damaged one goes, and the whole one stays."""
    _save(tmp_path, 2)
    damaged = _save(tmp_path, 4)
    data = (damaged / "unit_0001.optim.pt").read_bytes()
    (damaged / "unit_0001.optim.pt").write_bytes(data[:100])
    _save(tmp_path, 6, keep=2)
    assert [p.name for p in checkpoint.complete_dirs(tmp_path)] == ["step_000002", "step_000006"]
    _save(tmp_path, 8, keep=1)
    assert [p.name for p in checkpoint.complete_dirs(tmp_path)] == ["step_000008"]


def test_a_node_local_part_without_a_units_files_names_the_layout_it_needs(tmp_path):
    """A node-local checkpoint (training/shared_dir.py) holds its ranks' units only: a resume
    that asks it for another's says so, with the layout it was saved with. (Replica 1's files
    of its own: a --sync diloco run's.)"""
    files = checkpoint.save_units(tmp_path, 2, {1: _states(2)[1]}, replica=1)
    parallel = {"pp": 2, "dp": 2, "rank_order": "pp-dp", "sync": "diloco:2"}
    ckpt = checkpoint.finalize(tmp_path, 2, {"config": {"parallel": parallel}, "loader": {},
                                             "rng": {}, "ranks": [3]}, files, 2)
    assert checkpoint.missing_units(ckpt, [1], replica=1) == []
    assert checkpoint.missing_units(ckpt, [0, 1], replica=1) == [0]
    assert checkpoint.load_units(ckpt, [1], "cpu", replica=1)[1]["weights"]["b"][0] == 1.0
    with pytest.raises(checkpoint.CheckpointDamaged, match=r"one node's part \(ranks 3: .* no unit "
                       r"0: node-local checkpoints resume with the layout they were saved with "
                       r"\(--pp 2 --dp 2, rank order pp-dp\)"):
        checkpoint.load_units(ckpt, [0, 1], "cpu", replica=1)


def test_the_outer_state_is_written_by_whichever_replica_is_told_to(tmp_path):
    """--sync diloco's outer states are the same on every replica: in a node-local directory
    the first replica there writes them, replica 0 or not."""
    state = {**_states(2)[0], "outer": {"params": torch.ones(3)}}
    assert set(store.write_unit(tmp_path, 0, state, replica=1, outer=True)) == {
        "unit_0000.replica_1.safetensors", "unit_0000.replica_1.optim.pt", "unit_0000.outer.pt"}
    (tmp_path / "other").mkdir()
    assert "unit_0000.outer.pt" not in store.write_unit(tmp_path / "other", 0, state, outer=False)
