"""Lower-precision compute with fp32 masters: bf16 views train like fp32, and fp16's dynamic loss
scaling skips an overflowing step on every rank at once, lowers the scale, and trains on."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from ratrain import checkpoint
from ratrain.training.metrics import read_metrics
from ratrain.runtime.launch import launch_local
from ratrain.training.run import rank_main

from .conftest import STEPS, micro_config

pytestmark = pytest.mark.dist


def test_bf16_views_train_within_2_percent_of_fp32(corpus, reference, tmp_path):
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.train.dtype = "bfloat16"
    rank_main(cfg, str(tmp_path), False, False, False)
    rows, ref_rows = read_metrics(tmp_path / "metrics.jsonl"), read_metrics(reference[1] / "metrics.jsonl")
    assert len(rows) == STEPS
    worst = max(abs(r["loss"] - f["loss"]) / f["loss"] for r, f in zip(rows, ref_rows))
    assert worst < 0.02, worst
    assert rows[0]["loss"] != ref_rows[0]["loss"]  # it really computed in bf16
    weights = checkpoint.load_units(checkpoint.latest(tmp_path), [1], "cpu")[1]["weights"]
    assert all(w.dtype == torch.float32 for w in weights.values())  # the masters


def _inject_inf(inject_rank: int, inject_step: int, log_dir: str, *args) -> None:
    """rank_main, with an inf put into one unit's gradient on one rank at one step, and every
    step's outcome logged per rank."""
    from ratrain.runtime.executor import Executor
    from ratrain.runtime.unit_state import UnitState

    rank = int(os.environ["RANK"])
    train_step, fold_grads = Executor.train_step, UnitState.fold_grads
    now = {}

    def logged_step(self, program, batches, lr, step=0):
        now["step"] = step
        result = train_step(self, program, batches, lr, step)
        with open(Path(log_dir) / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "skipped": result.skipped,
                                "scale": self.loss_scale.scale}) + "\n")
        return result

    def poisoned_fold(self, role=None):
        fold_grads(self, role)
        if rank == inject_rank and now.get("step") == inject_step and self.grad is not None:
            self.grad[0] = float("inf")

    Executor.train_step, UnitState.fold_grads = logged_step, poisoned_fold
    rank_main(*args)


def test_fp16_overflow_on_one_rank_skips_the_step_everywhere(corpus, tmp_path):
    cfg = micro_config(*corpus, steps=8)
    cfg.train.dtype, cfg.train.grad_clip, cfg.train.checkpoint_every = "float16", 0.0, 4
    cfg.parallel.pp, cfg.parallel.dp = 2, 2
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    args = (cfg, str(run_dir), False, False, False)
    launch_local(4, _inject_inf, (3, 2, str(logs), *args), error_dir=run_dir / "errors")

    for rank in range(4):
        steps = [json.loads(line) for line in (logs / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [s["skipped"] for s in steps] == [s["step"] == 2 for s in steps], (rank, steps)
        scales = [s["scale"] for s in steps]
        assert scales[2] == scales[1] / 2 and scales[-1] == scales[2], (rank, scales)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["skipped"] for r in rows] == [r["step"] == 3 for r in rows]
    assert rows[-1]["loss"] < rows[3]["loss"] < rows[0]["loss"]  # trains before and after
    meta = checkpoint.load_meta(checkpoint.latest(run_dir))
    assert meta["loss_scale"]["scale"] == scales[-1] and meta["loss_scale"]["skipped_steps"] == 1


def test_fp16_diloco_replicas_keep_their_own_loss_scale_across_a_resume(corpus, tmp_path):
    """Under --sync diloco each replica's norm is its own, so an overflow on one replica skips
    its step alone and halves its scale alone; a resumed run gives each replica its own scale
    back (it gave every replica replica 0's until 2026-11-27)."""
    cfg = micro_config(*corpus, steps=4)
    cfg.train.dtype, cfg.train.grad_clip, cfg.train.checkpoint_every = "float16", 0.0, 2
    cfg.parallel.dp, cfg.parallel.sync = 2, "diloco:2"
    cfg.train.eval_batches = 0
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    launch_local(2, _inject_inf, (1, 0, str(logs), cfg, str(run_dir), False, False, False),
                 error_dir=run_dir / "errors")
    first = {r: [json.loads(x) for x in (logs / f"rank{r}.jsonl").read_text().splitlines()]
             for r in (0, 1)}
    assert [s["skipped"] for s in first[1]] == [True, False, False, False]
    assert not any(s["skipped"] for s in first[0])
    assert first[1][1]["scale"] == first[0][1]["scale"] / 2
    shutil.rmtree(checkpoint.checkpoint_dir(run_dir, 4))  # as if it had died after step 2
    for r in (0, 1):
        (logs / f"rank{r}.jsonl").unlink()
    ckpt = str(checkpoint.latest(run_dir))
    launch_local(2, _inject_inf, (1, -1, str(logs), cfg, str(run_dir), ckpt, False, False),
                 error_dir=run_dir / "errors")
    for r in (0, 1):
        resumed = [json.loads(x) for x in (logs / f"rank{r}.jsonl").read_text().splitlines()]
        assert [s["scale"] for s in resumed] == [s["scale"] for s in first[r][2:]], r
    # what the run says of it: each replica's skips and scales (replica 0's alone until
    # 2026-12-02: replica 1's skip showed in the checkpoint only)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["skipped_per_replica"] for r in rows] == [[False, s["skipped"]] for s in first[1]]
    assert [r["skipped"] for r in rows] == [True, False, False, False]
    assert [r["loss_scale_per_replica"] for r in rows] == [
        [a["scale"], b["scale"]] for a, b in zip(first[0], first[1])]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["skipped_steps"] == [1]
    assert summary["skipped_steps_per_replica"] == [[], [1]]
    assert summary["loss_scale_per_replica"] == rows[-1]["loss_scale_per_replica"]
