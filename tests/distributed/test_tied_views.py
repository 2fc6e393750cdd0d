"""A tied head with a view window trains: the embedding's view is held for the head, so the run
is the resident-view run's, bit for bit (every view is an exact copy of its master either way),
with evaluation between steps, and the tied weight's gradient from both units folded."""

from __future__ import annotations

import json

import pytest

from ratrain import checkpoint
from ratrain.schedule.plan import build_plan
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main

from .conftest import micro_config, one_thread

pytestmark = pytest.mark.dist


def _tied_run(corpus, run_dir, window: int, group: int):
    cfg = micro_config(*corpus, steps=6)
    cfg.model.tie_embeddings = True
    cfg.train.eval_every = 3
    # on a CPU the run would compute on the masters (no views): the plan asks for views
    plan = build_plan(cfg.model.n_layers, 1, 1, cfg.n_micro, activation="recompute",
                      view_window=window, state_home="host", micro_batch_group=group,
                      tie_embeddings=True)
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.parallel.state_home, cfg.parallel.plan_file = "host", str(run_dir / "plan.json")
    with one_thread():
        rank_main(cfg, str(run_dir), False, False, False)
    return read_metrics(run_dir / "metrics.jsonl"), checkpoint.load_meta(
        checkpoint.latest(run_dir))["plan"]


@pytest.mark.parametrize("group", [1, 2])
def test_a_tied_head_with_a_window_trains_as_with_resident_views(group, corpus, tmp_path):
    rows, plan = _tied_run(corpus, tmp_path / "window", 1, group)
    ref, _ = _tied_run(corpus, tmp_path / "resident", 0, group)
    assert plan["tie_embeddings"] and plan["view_window"] == 1
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]
    assert [r.get("val_loss") for r in rows] == [r.get("val_loss") for r in ref]
    assert [r["grad_norm"] for r in rows] == [r["grad_norm"] for r in ref]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3
