"""Under torchrun every rank chooses its schedule on its own node (--schedule auto): ranks that
chose differently take rank 0's choice once the world is joined, or all refuse it together
where a node cannot hold it (training/agreed_plan.py). Two gloo ranks that chose differently.
And nodes started with different settings are refused on every rank at the start."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.runtime.launch import launch_local

from .conftest import micro_config
from .nodes import start_nodes

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


WAIT_S = 60
"""The longest wait for the two nodes here (a refusal comes in seconds, 2 steps in about 10)."""
COMM_TIMEOUT_S = 120
"""Past WAIT_S: a node left waiting for the other shows as a hang."""


def _two_nodes(corpus, tmp_path: Path, flags: tuple[list[str], list[str]]
               ) -> list[tuple[int, str]]:
    """`ratrain train` at dp 2 as two torchrun nodes of one rank each (its environment, each
    node in a directory of its own), each rank given its `flags` besides: each node's exit
    status and stderr."""
    cfg = micro_config(*corpus, steps=2)
    cfg.train.eval_every, cfg.train.checkpoints = 0, False
    cfg.save(tmp_path / "run.yaml")
    procs = start_nodes(corpus, tmp_path / "run.yaml", "agreed-config", [
        ["--comm-timeout", str(COMM_TIMEOUT_S), *own] for own in flags])
    ended, start = [], time.monotonic()
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=max(1.0, WAIT_S - (time.monotonic() - start)))
            ended.append((proc.returncode, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        waiting = [proc.communicate()[1][-3000:] for proc in procs[len(ended):]]
        pytest.fail(f"hung: no end in {WAIT_S} s (--comm-timeout {COMM_TIMEOUT_S}):\n"
                    + "\n".join(waiting))
    return ended


@pytest.mark.parametrize("flags, line", [
    # until 2026-12-04 both trained, to replicas that differed (each config.yaml its own lr)
    (([], ["--lr", "0.03"]), "train.lr is 0.003 on rank 0 and 0.03 on rank 1"),
    # ... and these too (meeting once, at the end); over more steps they aborted in gloo at
    # their first meeting ("Received data size doesn't match")
    ((["--sync", "diloco:4"], ["--sync", "diloco:3"]),
     "parallel.sync is 'diloco:4' on rank 0 and 'diloco:3' on rank 1"),
    # settings that shape the process groups: compared before the groups are made, which
    # until the check came before them waited there (until --comm-timeout, or for good)
    ((["--sync", "step"], ["--sync", "diloco:3"]), "parallel.sync is 'step' on rank 0 and "
     "'diloco:3' on rank 1"),
    ((["--schedule", "1f1b"], ["--schedule", "1f1b", "--pp", "2", "--dp", "1"]),
     "parallel.pp is 1 on rank 0 and 2 on rank 1"),
    # ... and before the link probe of --schedule auto across nodes, whose layout they are
    (([], ["--pp", "2", "--dp", "1"]), "parallel.pp is 1 on rank 0 and 2 on rank 1"),
])
def test_nodes_started_with_different_settings_are_refused_on_every_rank(corpus, tmp_path,
                                                                         flags, line):
    for code, err in _two_nodes(corpus, tmp_path, flags):
        assert code == 2, err[-3000:]
        assert (f"error: the nodes were started with different settings: {line} (every node "
                "runs the same command)\n") in err, err[-3000:]
        assert "Traceback" not in err


def test_nodes_that_differ_only_in_their_own_settings_train(corpus, tmp_path):
    # its threads and its patience are the node's: the same run
    for code, err in _two_nodes(corpus, tmp_path,
                                ([], ["--threads", "1", "--comm-timeout", "100"])):
        assert code == 0, err[-3000:]
    assert (tmp_path / "node_0" / "run" / "summary.json").exists()


def _settings_of_rank(out: str) -> None:
    from ratrain.runtime.process_groups import join_world
    from ratrain.training.agreed_config import agreed_config

    rank = int(os.environ["RANK"])
    join_world("gloo", 60.0)
    cfg = RunConfig()
    cfg.train.lr = {0: 1e-3, 3: 0.01}.get(rank, 0.03)
    cfg.data.path, cfg.parallel.threads_per_rank = f"/node_{rank}/text", rank + 1  # its own
    try:
        agreed_config(cfg)
        result = "agreed"
    except UserError as e:
        result = str(e)
    Path(out, f"rank_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_every_rank_names_the_ranks_that_differ_from_rank_0(tmp_path):
    launch_local(4, _settings_of_rank, (str(tmp_path),), error_dir=tmp_path / "errors")
    for r in range(4):
        assert json.loads((tmp_path / f"rank_{r}.json").read_text()) == (
            "the nodes were started with different settings: train.lr is 0.001 on rank 0 and "
            "0.03 on ranks 1-2, 0.01 on rank 3 (every node runs the same command)")
