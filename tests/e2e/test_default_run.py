"""The embedded default run, exactly as a user starts it (`ratrain train`, no arguments), then
its export loaded by transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.training.metrics import read_metrics
from ratrain.models.llama import LlamaModel

from ..unit.cli_runner import run_cli
from ..unit.report_checks import check_mfu, check_page


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("default")
    env = {**os.environ, "RATRAIN_CACHE": str(cwd / "cache")}
    proc = subprocess.run([sys.executable, "-m", "ratrain.cli", "train", "--no-progress"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return cwd, proc


def test_default_run_loss_falls(default_run):
    cwd, proc = default_run
    run = cwd / "runs" / "latest"
    assert run.is_symlink() and run.resolve().name in proc.stdout
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 301))
    assert rows[0]["loss"] > 5.5  # ~ln(257) at initialization
    last = sum(r["loss"] for r in rows[-20:]) / 20
    assert last < 2.3, last  # 1.90 when measured
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == 3 and val[-1] < val[0] and val[-1] < 2.2  # 1.77 when measured
    assert all(r["tokens_per_s"] > 0 and r["peak_memory_bytes"] > 0 for r in rows)
    assert (run / "report" / "loss.png").stat().st_size > 10_000
    assert checkpoint.latest(run).name == "step_000300"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 300 and summary["final_loss"] == rows[-1]["loss"]


def test_default_run_writes_its_report_and_mfu(default_run):
    cwd, proc = default_run
    run = (cwd / "runs" / "latest").resolve()
    assert f"report: {cwd / 'runs' / run.name}/report/index.html" in proc.stdout  # (absolute,
    assert "MFU:" in proc.stdout  # as the run's line is, and a resumed run's since 2026-12-02)
    html = check_page(run / "report", {"loss.png", "throughput.png", "memory.png"})
    assert "MFU" in html and "single process" in html
    check_mfu(run)


def test_export_loads_in_transformers(default_run, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    cwd, _ = default_run
    run = (cwd / "runs" / "latest").resolve()
    out = tmp_path / "hf"
    # in this process: the command is the same, without a second interpreter importing torch
    code, _, err = run_cli(monkeypatch, capsys, "export", str(run), "--out", str(out))
    assert code == 0, err

    cfg = RunConfig.load(run / "config.yaml")
    ours = LlamaModel(cfg.model)
    states = checkpoint.load_units(checkpoint.latest(run), range(cfg.model.n_units), torch.device("cpu"))
    for u, unit in enumerate(ours.units):
        unit.load_state_dict(states[u]["weights"])
    theirs = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    tokens = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (ours(tokens) - theirs(tokens).logits).abs().max().item()
    assert diff < 1e-4
