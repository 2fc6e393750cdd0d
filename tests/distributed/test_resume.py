"""Checkpoints are by unit: a run resumed from one, with the same or another pipeline layout,
continues exactly as if it had never stopped."""

from __future__ import annotations

import json
import shutil

import pytest

from ratrain import checkpoint
from ratrain.training.metrics import read_metrics
from ratrain.training.run import train

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
        if (resume_pp, resume_dp) == (2, 1):  # the same plan: the same arithmetic
            assert got[step] == want[step], (step, got[step], want[step])
        else:
            assert abs(got[step] - want[step]) / want[step] < 1e-5, (step, got[step], want[step])
    assert checkpoint.latest(run).name == "step_000010"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows if r.get("resumed")] == [6]
    # ranks of another layout had other jobs: their memory peaks count from the resume, said so
    since = None if (resume_pp, resume_dp) == (2, 1) else 6
    assert [r["step"] for r in rows if "memory_peaks_from_step" in r] == ([since] if since else [])
    summary = json.loads((run / "summary.json").read_text())
    assert summary.get("memory_peaks_from_step") == since


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,file,needle", [
    (_truncate, "unit_0003.safetensors", "is truncated"),
    (_flip_a_bit, "unit_0002.optim.pt", "does not match its sha256"),
])
def test_a_damaged_checkpoint_is_named_and_skipped_on_resume(corpus, full_run, tmp_path, capsys,
                                                              damage, file, needle):
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    damage(checkpoint.checkpoint_dir(run, 10) / file)

    cfg = micro_config(*corpus, steps=10)
    cfg.parallel.pp = 2
    train(cfg, run, resume=True, progress=False, trace=False)

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skipping checkpoint step_000010: {file} {needle}"), err
    assert err[0].endswith("the newest that verifies is step_000005")
    want, got = _losses(full_run), _losses(run)
    assert got == want  # resumed from step 5, every step as the run that was never damaged
    assert checkpoint.latest(run).name == "step_000010"  # saved again, whole
