"""What the planner, `ratrain train --memory-budget`, `ratrain plan`, `ratrain profile` and the
node-local checkpoints' checks say of a count agrees with it in number ("1 micro-batch", "2
micro-batches", "rank 1 sees", "ranks 1, 2 see"), and a lifecycle with no views says so in
words, not with a "-"."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ratrain.counts import counted, noun_for
from ratrain.errors import UserError
from ratrain.planner.lifecycle import Lifecycle
from ratrain.sim.profile import load_profile
from ratrain.sim.profile_repeats import combine

from .cli_runner import run_cli


def test_counted_agrees_with_its_number():
    assert counted(1, "rank") == "1 rank"
    assert counted(0, "rank") == "0 ranks"
    assert counted(2, "micro-batch", "micro-batches") == "2 micro-batches"
    assert counted(1, "micro-batch", "micro-batches") == "1 micro-batch"
    assert noun_for(3, "unit") == "units" and noun_for(1, "unit") == "unit"


def test_a_lifecycle_without_views_says_so_in_words():
    assert Lifecycle("device", None, "ratrain").label() == "device / no views"
    assert Lifecycle("host", 1, "ratrain").label(1) == "host, 1 unit on device / window 1"
    assert Lifecycle("host", 1, "ratrain").label(2) == "host, 2 units on device / window 1"


def test_the_train_start_line_counts_one_micro_batch_as_one(monkeypatch, capsys, tmp_path):
    """A global batch of 1 on one device: one micro-batch of 1, said so, and its views
    named (none: fp32 on a CPU)."""
    from ratrain.training import run

    def stop(*args, **kwargs):
        raise UserError("stopped before training: the test reads the start line")

    monkeypatch.setattr(run, "train", stop)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", "tiny", "--memory-budget",
                           "1GB", "--devices", "1", "--global-batch", "1", "--seq-len", "32",
                           "--threads", "1", "--run-dir", str(tmp_path / "run"))
    assert code != 0 and "stopped before training" in err, err
    start = next(line for line in err.splitlines() if line.startswith("--memory-budget "))
    assert ": the only layout (1 simulated in " in start, start  # not "the fastest of 1"
    assert ", 1 micro-batch of 1, " in start, start
    assert "state / views: device / no views; predicted" in start, start


def test_the_plan_heading_counts_one_layout_and_one_plan_as_one():
    from ratrain.cli.plan_cmd import _heading

    layout = SimpleNamespace(devices=1, groups=[])
    request = SimpleNamespace(model=SimpleNamespace(name="tiny"),
                              profile=SimpleNamespace(name="cpu-local", groups=None, notes={}),
                              global_batch=8, seq_len=256, dtype="float32", policy="ratrain",
                              budget_bytes=1e9, margin=0.1, devices=1,
                              threads_of=lambda layout: 1)
    found = SimpleNamespace(request=request, best=[SimpleNamespace(layout=layout)], layouts=1,
                            simulated=1, seconds=0.0, cut=None)
    assert "searched 1 layout, simulated 1 plan in 0.0 s" in _heading(found)


def test_the_plan_of_one_unit_stages_names_one_unit(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--pp", "6", "--global-batch", "12")
    assert code == 0, err
    assert "stage 0: unit 0, stage 1: unit 1," in out.splitlines()[0], out


def _repeat():
    return load_profile("cpu-local")


def test_a_single_measurement_beside_other_work_is_not_called_repeats():
    note = combine([_repeat()], [4096.0], other_work=[1.42]).notes["other_work"]
    assert note.startswith("other work kept 1.42 cores busy during the measuring: "), note
    assert "repeats" not in note and "its range from 0 to that (unstable)" in note, note
    note = combine([_repeat(), _repeat()], [4096.0], other_work=[1.42, 0.9]).notes["other_work"]
    assert note.startswith("other work kept 1.42, 0.90 cores busy during the 2 repeats: "), note
    note = combine([_repeat()] * 3, [4096.0], other_work=[1.42, 0.9, 0.0]).notes["other_work"]
    assert note.endswith("the 2 repeats beside more than 0.25 cores of it are set aside"), note


def test_the_profile_description_and_notes_count_one_rank_as_one():
    from ratrain.profiling.measure import _description, _notes, profile_config

    cfg = profile_config("tiny", 64, 1, "float32")
    assert "1 concurrent rank of 1 thread." in _description(cfg, "tiny", 1, "cpu")
    assert "2 concurrent ranks of 1 thread." in _description(cfg, "tiny", 2, "cpu")
    notes = _notes(cfg, 1, "cpu")
    assert "a pipeline of the 1 measuring rank, one stage each" in notes["device.contention"]
    assert "rank(s)" not in notes["measured"] + notes["device.contention"]


def _gathering(monkeypatch, *answers):
    """shared_dir's collectives answered, one call after another, as the ranks would."""
    from ratrain.training import shared_dir

    calls = iter(answers)
    monkeypatch.setattr(shared_dir.timed_comm, "all_gather_object",
                        lambda *args, **kwargs: next(calls))
    return shared_dir


def test_a_unit_no_node_saves_is_one_unit_or_several(monkeypatch):
    for missing, said in (([0], "rank 1 reads unit 0 at a resume (a tied embedding's copy) "
                                "and no rank that sees its checkpoint directory saves it: "),
                          ([0, 5], "rank 1 reads units 0, 5 at a resume (a tied embedding's "
                                   "copy) and no rank that sees its checkpoint directory saves "
                                   "them: ")):
        shared_dir = _gathering(monkeypatch, [(None, []), (None, missing)])
        with pytest.raises(UserError) as e:
            shared_dir.agreed_local_checkpoint(Path("."), 0, None, [0], set(), 0, 1.0,
                                               torch.device("cpu"))
        assert said in str(e.value), str(e.value)


def test_ranks_that_see_a_directory_apart_are_one_rank_or_several(monkeypatch, tmp_path):
    for keys, said in (([(0, 1, "a"), (1, 2, "b")], "rank 1 sees files some of the ranks it "
                                                     "shares it with do not"),
                       ([(0, 1, "a"), (1, 2, "b"), (2, 2, "c")],
                        "ranks 1, 2 see files some of the ranks they share it with do not")):
        shared_dir = _gathering(monkeypatch, ["token"], keys)
        with pytest.raises(UserError) as e:
            shared_dir.shared_by(tmp_path, 0, len(keys), 1.0, torch.device("cpu"), look_for_s=0)
        assert said in str(e.value), str(e.value)
