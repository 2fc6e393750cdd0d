"""A plan made for a Hugging Face directory carries its weights (run.train.init_from), which
`train --plan` starts from (it trained from random ones until 2026-12-03); and `plan --out` to
a path it cannot write is refused before the search (it was refused only after it)."""

import json

import pytest
import torch
import yaml

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.models import LlamaModel, save_hf

from .cli_runner import run_cli

MODEL = ModelConfig(name="hf", vocab_size=257, dim=32, n_layers=2, n_heads=2, ffn_dim=64,
                    max_seq_len=64)
SHAPE = ("--seq-len", "16", "--global-batch", "2")
SEARCH = (*SHAPE, "--memory-budget", "1GB", "--devices", "1")
TRAIN = ("--threads", "1", "--steps", "1", "--eval-batches", "0", "--data", "text.txt",
         "--no-report", "--no-checkpoints", "--no-progress", "--json")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 300)
    model = LlamaModel(MODEL)
    with torch.no_grad():  # weights far from any init, so that a random start shows in the loss
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    save_hf(model, MODEL, tmp_path / "hf")


def _train(monkeypatch, capsys, run: str, *args: str) -> tuple[int, dict, str]:
    code, out, err = run_cli(monkeypatch, capsys, "train", *args, *TRAIN, "--run-dir", run)
    return code, json.loads(out) if code == 0 else {}, err


def _init_from(run: str):
    return yaml.safe_load(open(f"{run}/config.yaml"))["train"]["init_from"]


@pytest.mark.parametrize("search", [SEARCH, SHAPE], ids=["searched", "described"])
def test_a_plan_for_a_directory_trains_from_its_weights(monkeypatch, capsys, tmp_path, search):
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "hf", *search,
                           "--out", "plan.json")
    assert code == 0, err
    hf = str((tmp_path / "hf").resolve())
    assert json.loads((tmp_path / "plan.json").read_text())["run"]["train"]["init_from"] == hf
    code, loaded, err = _train(monkeypatch, capsys, "by-model", "--model", "hf", *SHAPE)
    assert code == 0, err
    code, planned, err = _train(monkeypatch, capsys, "by-plan", "--plan", "plan.json")
    assert code == 0, err
    assert _init_from("by-plan") == hf
    assert planned["final_loss"] == pytest.approx(loaded["final_loss"], rel=1e-5)
    code, _, err = _train(monkeypatch, capsys, "beside", "--plan", "plan.json", "--model", "hf")
    assert code == 0, err  # the directory it was made for, named again
    assert _init_from("beside") == hf


def test_a_plan_whose_directory_is_gone(monkeypatch, capsys, tmp_path):
    assert run_cli(monkeypatch, capsys, "plan", "--model", "hf", *SEARCH,
                   "--out", "plan.json")[0] == 0
    hf = (tmp_path / "hf").resolve()
    (tmp_path / "elsewhere").mkdir()
    moved = (tmp_path / "hf").rename(tmp_path / "elsewhere" / "copy")
    code, _, err = _train(monkeypatch, capsys, "gone", "--plan", "plan.json")
    assert code == 2
    assert err.strip() == (f"error: plan.json starts from the weights in {hf}, which is not a "
                           "directory (moved or deleted?): put it back there, or give --model "
                           "DIR where it is now")
    assert not (tmp_path / "gone").exists()
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "--plan", "plan.json")
    assert code == 0, err  # a prediction reads no weights
    code, _, err = _train(monkeypatch, capsys, "found", "--plan", "plan.json", "--model",
                          str(moved))
    assert code == 0, err  # renamed too: the model is the plan's, field for field
    assert _init_from("found") == str(moved.resolve())


def test_a_plan_for_a_preset_trains_from_random_weights(monkeypatch, capsys, tmp_path):
    assert run_cli(monkeypatch, capsys, "plan", "--model", "tiny", *SEARCH,
                   "--out", "plan.json")[0] == 0
    assert json.loads((tmp_path / "plan.json").read_text())["run"]["train"]["init_from"] is None
    code, _, err = _train(monkeypatch, capsys, "run", "--plan", "plan.json")
    assert code == 0, err
    assert _init_from("run") is None


@pytest.mark.parametrize("where, said", [
    ("no/dir/plan.json", "cannot write the plan there (No such file or directory)"),
    ("a_file/plan.json", "cannot write the plan there (Not a directory)"),
])
def test_an_out_it_cannot_write_is_refused_before_the_search(monkeypatch, capsys, tmp_path,
                                                            where, said):
    searched = []

    def best_plans(request):
        searched.append(request)
        raise UserError("searched")

    monkeypatch.setattr("ratrain.cli.plan_search.best_plans", best_plans)
    (tmp_path / "a_file").write_text("")
    before = sorted(tmp_path.iterdir())
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", *SEARCH,
                           "--out", where)
    assert code == 2
    assert err.strip() == f"error: --out {where}: {said}"
    assert searched == []
    assert sorted(tmp_path.iterdir()) == before  # the trial write leaves nothing
