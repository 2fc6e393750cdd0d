"""The link probe of a multi-node run (training/link_profile.py): local gloo ranks told that
they are two nodes (LOCAL_WORLD_SIZE, as torchrun sets it) probe the links of their layout at
the start, --schedule auto is chosen on the measured profile, and rank 0 says both. The probe's
figures are whatever loopback gives; what is tested is that it runs, is used and is said, and
that one node's ranks skip it."""

from __future__ import annotations

import json
import os
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from ratrain.runtime.launch import launch_local
from ratrain.training.metrics import read_metrics
from ratrain.training.run import train

from .conftest import micro_config

pytestmark = pytest.mark.dist


def train_rank(cfg, run_dir: str, log_dir: str) -> None:
    # each rank's stderr to a file: the fork server's own stderr is that of the test that
    # started it, which no later test's capture sees
    with open(Path(log_dir) / f"rank{os.environ['RANK']}.err", "w") as f, redirect_stderr(f):
        train(cfg, Path(run_dir), progress=True, trace=False)


def _run(corpus, tmp_path, monkeypatch, local_world: int):
    cfg = micro_config(*corpus, steps=2)
    cfg.parallel.pp, cfg.parallel.dp = 2, 2  # pp-dp: a stage's replicas are neighbours
    cfg.train.eval_batches = 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    run_dir = tmp_path / "run"
    launch_local(4, train_rank, (cfg, str(run_dir), str(tmp_path)), error_dir=tmp_path / "errors")
    return run_dir, (tmp_path / "rank0.err").read_text()


def test_two_nodes_probe_their_links_and_choose_the_schedule_on_them(corpus, tmp_path,
                                                                     monkeypatch):
    run_dir, err = _run(corpus, tmp_path, monkeypatch, local_world=2)
    said = [line for line in err.splitlines() if line.startswith("links measured at the start")]
    assert len(said) == 1, err  # rank 0 says it, once
    # nodes {0, 1} and {2, 3}: each stage's replicas share a node, the stages' sends cross
    assert "within a node: all-reduce" in said[0] and "between nodes: send" in said[0]
    assert "Mbit/s" in said[0] or "Gbit/s" in said[0]
    chosen = [line for line in err.splitlines() if line.startswith("schedule ")]
    assert chosen and "on cpu-local + measured links" in chosen[0], err
    assert len(read_metrics(run_dir / "metrics.jsonl")) == 2  # and the run trained on
    assert json.loads((run_dir / "plan.json").read_text())["schedule"] in ("1f1b", "zbh1")


def test_one_node_skips_the_probe(corpus, tmp_path, monkeypatch):
    _, err = _run(corpus, tmp_path, monkeypatch, local_world=4)
    assert "links measured" not in err
    assert "on cpu-local (" in err  # the preset's links, as before
