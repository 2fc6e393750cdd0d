"""Under torchrun every rank chooses its schedule on its own node (--schedule auto): ranks that
chose differently take rank 0's choice once the world is joined, or all refuse it together
where a node cannot hold it (training/agreed_plan.py). Two gloo ranks that chose differently."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.runtime.launch import launch_local

pytestmark = pytest.mark.dist


def _rank(out: str, refused_on_rank_1: bool) -> None:
    from ratrain.runtime.process_groups import join_world
    from ratrain.training import agreed_plan
    from ratrain.training.prepare import plan_here

    rank = int(os.environ["RANK"])
    join_world("gloo", 60.0)
    cfg = RunConfig()
    cfg.parallel.pp, cfg.train.global_batch, cfg.train.micro_batch_size = 2, 8, 2
    # as two nodes might have chosen: ZB-H1 where memory was free, 1F1B where it was not
    cfg.parallel.schedule, cfg.parallel.weight_grad = (("zbh1", "bubble") if rank == 0
                                                       else ("1f1b", None))
    cfg.parallel.micro_batch_group = 1
    plan = plan_here(cfg)
    if refused_on_rank_1 and rank == 1:
        def too_small(*args):
            raise UserError("stage 1 needs 9 GB, this node has 8")
        agreed_plan.check_memory_fits = too_small
    try:
        plan = agreed_plan.agreed(cfg, plan, rank)
        result = {"plan": plan.to_dict(), "schedule": cfg.parallel.schedule}
    except UserError as e:
        result = {"error": str(e)}
    Path(out, f"rank_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _results(tmp_path, refused: bool) -> list[dict]:
    launch_local(2, _rank, (str(tmp_path), refused), error_dir=tmp_path / "errors")
    return [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]


def test_ranks_that_chose_differently_run_rank_0s_plan(tmp_path):
    zero, one = _results(tmp_path, refused=False)
    assert zero["schedule"] == one["schedule"] == "zbh1"
    assert one["plan"] == zero["plan"]  # the same programs: nothing waits on a missing send


def test_a_choice_one_node_cannot_hold_is_refused_on_every_rank(tmp_path):
    for result in _results(tmp_path, refused=True):
        assert result["error"].startswith("the ranks chose different schedules on their nodes "
                                          "(rank 0: zbh1 bubble; rank 1: 1f1b), and rank 0's "
                                          "cannot run on rank 1's: stage 1 needs 9 GB")
