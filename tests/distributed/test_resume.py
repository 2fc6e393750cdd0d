"""Checkpoints are by unit: a run resumed from one, with the same or another pipeline layout,
continues exactly as if it had never stopped."""

from __future__ import annotations

import shutil

import pytest

from ratrain import checkpoint
from ratrain.metrics import read_metrics
from ratrain.train import train

from .conftest import micro_config

pytestmark = pytest.mark.dist


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")}


@pytest.fixture(scope="module")
def full_run(corpus, tmp_path_factory):
    """10 steps on pp=2, checkpointed at steps 5 and 10."""
    cfg = micro_config(*corpus, steps=10)
    cfg.parallel.pp = 2
    cfg.train.checkpoint_every = 5
    run = tmp_path_factory.mktemp("full")
    train(cfg, run, progress=False, trace=False)
    return run


@pytest.mark.parametrize("resume_pp,resume_dp", [(2, 1), (1, 1), (1, 2)])
def test_resume_continues_the_same_run(corpus, full_run, tmp_path, resume_pp, resume_dp):
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    shutil.rmtree(checkpoint.checkpoint_dir(run, 10))  # as if the run had died after step 5
    assert checkpoint.latest(run).name == "step_000005"

    cfg = micro_config(*corpus, steps=10)
    cfg.parallel.pp, cfg.parallel.dp = resume_pp, resume_dp
    train(cfg, run, resume=True, progress=False, trace=False)

    want, got = _losses(full_run), _losses(run)
    assert sorted(got) == list(range(1, 11))  # the log was cut back to step 5, then continued
    for step in range(6, 11):
        assert abs(got[step] - want[step]) / want[step] < 1e-5, (step, got[step], want[step])
    assert checkpoint.latest(run).name == "step_000010"
