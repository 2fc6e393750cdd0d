"""checkpoint/saving.py in one process: a snapshot is a copy the training may go on changing,
short host memory writes units at once with the same files, the main rank publishes only when
every rank's part is marked done, and a save's failure reaches the training thread."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from ratrain import checkpoint
from ratrain.checkpoint import manifest, saving


def _states() -> list[tuple[int, dict]]:
    """Two units as the engines give them: live weights and an AdamW state dict."""
    out = []
    for u in (0, 1):
        p = torch.nn.Parameter(torch.full((3, 4), float(u + 1)))
        opt = torch.optim.AdamW([p], lr=1e-3)
        p.grad = torch.ones_like(p)
        opt.step()
        out.append((u, {"weights": {"w": p.detach()}, "optim": opt.state_dict()}))
    return out


def _save(run_dir, states, copy: bool) -> tuple[checkpoint.Path, saving.Taken]:
    taken = saving.take(run_dir, 5, states, writes=True, copy=copy)
    for _, state in states:  # training goes on: the live tensors change after the take
        state["weights"]["w"].add_(100.0)
        state["optim"]["state"][0]["exp_avg"].add_(100.0)
    saving.write_part(run_dir, 5, 0, taken, {"torch": "generators"})
    return saving.publish(run_dir, 5, [0], {"config": {}, "loader": {"step": 5}}, 2, 10), taken


def test_a_snapshot_is_what_the_step_left_and_short_memory_writes_the_same_files(tmp_path, monkeypatch):
    states = _states()
    want = {u: s["weights"]["w"].clone() for u, s in states}
    copied, taken = _save(tmp_path / "copied", states, copy=True)
    assert len(taken.copied) == 2 and taken.written_now == 0
    assert taken.copy_bytes == 2 * (12 + 12 + 12 + 1) * 4  # weights, two moments, step
    loaded = checkpoint.load_units(copied, [0, 1], "cpu")
    assert all(torch.equal(loaded[u]["weights"]["w"], want[u]) for u in (0, 1))
    assert checkpoint.load_meta(copied)["rng"] == {"0": {"torch": "generators"}}

    monkeypatch.setattr(saving, "HOST_RESERVE_BYTES", 1 << 60)  # no host has this much
    direct, taken = _save(tmp_path / "direct", _states(), copy=True)
    assert taken.copied == [] and taken.written_now == 2
    assert checkpoint.load_meta(direct)["files"] == checkpoint.load_meta(copied)["files"]
    assert not list((direct.parent).glob("*.partial")) and manifest.problem(direct) is None


def test_the_main_rank_publishes_only_when_every_rank_has_marked_its_part(tmp_path):
    taken = saving.take(tmp_path, 3, _states()[:1], writes=True, copy=True)
    saving.write_part(tmp_path, 3, 0, taken, {})
    published = []
    main = threading.Thread(target=lambda: published.append(
        saving.publish(tmp_path, 3, range(2), {"config": {}}, 2, 30)))
    main.start()
    time.sleep(0.3)
    assert main.is_alive() and not checkpoint.complete_dirs(tmp_path)  # rank 1 is not done
    rank1 = saving.take(tmp_path, 3, _states()[1:], writes=True, copy=True)
    saving.write_part(tmp_path, 3, 1, rank1, {"rank": 1})
    main.join(timeout=30)
    assert published == [checkpoint.checkpoint_dir(tmp_path, 3)]
    meta = checkpoint.load_meta(published[0])
    assert sorted(meta["files"]) == ["unit_0000.optim.pt", "unit_0000.safetensors",
                                     "unit_0001.optim.pt", "unit_0001.safetensors"]
    assert meta["rng"] == {"0": {}, "1": {"rank": 1}}
    assert sorted(p.name for p in published[0].iterdir()) == sorted([*meta["files"], manifest.NAME])


def test_a_rank_that_never_marks_its_part_or_removes_the_directory_is_named(tmp_path):
    saving.write_part(tmp_path, 3, 0, saving.Taken(), {})
    with pytest.raises(checkpoint.CheckpointWriteError,
                       match=r"step_000003 was not published: rank\(s\) 1, 2 did not write"):
        saving.publish(tmp_path, 3, range(3), {}, 2, 0.1)
    checkpoint.remove_partials(tmp_path)  # as a rank whose disk filled does
    with pytest.raises(checkpoint.CheckpointWriteError, match="another rank's write failed"):
        saving.publish(tmp_path, 3, range(2), {}, 2, 10)


def test_one_save_in_flight_and_its_failure_reaches_the_training_thread():
    saver, order = saving.Saver(background=True), []
    release = threading.Event()
    saver.submit(1, 0.0, lambda: (release.wait(10), order.append(1)))
    assert saver.in_flight()
    threading.Timer(0.2, release.set).start()
    saver.submit(2, 0.0, lambda: order.append(2))  # waits for save 1 first
    saver.wait()
    assert order == [1, 2] and saver.times[0]["waited_s"] >= 0.1

    def full_disk():
        raise OSError(28, "No space left on device")

    saver.submit(3, 0.0, full_disk)
    while saver.in_flight():
        time.sleep(0.01)
    with pytest.raises(OSError, match="No space left"):
        saver.check()
    saver.check()  # raised once

    sync = saving.Saver(background=False)
    with pytest.raises(OSError, match="No space left"):
        sync.submit(4, 0.0, full_disk)


def test_an_abandoned_save_has_stopped_when_the_run_goes_on_to_clean_up():
    """Loop.run abandons the save in flight on any failure or Ctrl-C before train() removes the
    partial directory: a writer still running then published an empty step_N."""
    saver, order = saving.Saver(background=True), []

    def writes_until_cancelled():
        while not saver.cancelled.wait(0.01):
            pass
        time.sleep(0.2)  # the unit being written when the cancel came
        order.append("stopped")
        raise OSError(28, "No space left on device")  # dropped: the run's own failure is said

    saver.submit(1, 0.0, writes_until_cancelled)
    saver.abandon()
    assert order == ["stopped"] and not saver.in_flight()
    saver.check()
    saver.wait()  # nothing left to raise


def test_a_wait_that_ctrl_c_interrupts_still_leaves_abandon_waiting_for_the_writer():
    """A Ctrl-C landing in Thread.join (Python 3.11) left the thread taken for stopped while it
    wrote on: abandon returned at once, and the writer outlived the run (exit 134)."""
    saver, order = saving.Saver(background=True), []
    release = threading.Event()

    def writes():
        release.wait(10)
        time.sleep(0.1)
        order.append("written")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)  # (SIGINT is the test runner's)
    try:
        saver.submit(1, 0.0, writes)
        threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident,
                                                   signal.SIGUSR1)).start()
        with pytest.raises(KeyboardInterrupt):
            saver.wait()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    release.set()
    saver.abandon()
    assert order == ["written"] and not saver.in_flight()
