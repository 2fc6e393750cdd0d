"""Under torchrun the nodes may not share the checkpoint directory (a node-local disk): every
rank looks for the file rank 0 wrote there before the first step (training/shared_dir.py). Two
gloo ranks, given one directory, then each its own as two machines' local disks would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ratrain.errors import UserError
from ratrain.runtime.launch import launch_local

pytestmark = pytest.mark.dist


def _rank(out: str, own_disks: bool) -> None:
    from ratrain.runtime.process_groups import join_world
    from ratrain.training.shared_dir import check_shared

    rank = int(os.environ["RANK"])
    join_world("gloo", 60.0)
    directory = Path(out, f"node_{rank}" if own_disks else "shared", "checkpoints")
    try:
        check_shared(directory, rank, 60.0, torch.device("cpu"), look_for_s=1.0)
        dist.barrier()  # rank 0 removes the file once it knows every rank saw it
        result = {"left": sorted(p.name for p in directory.iterdir())}
    except UserError as e:
        result = {"error": str(e)}
    Path(out, f"rank_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _results(tmp_path, own_disks: bool) -> list[dict]:
    launch_local(2, _rank, (str(tmp_path), own_disks), error_dir=tmp_path / "errors")
    return [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]


def test_a_shared_directory_passes_and_keeps_nothing_of_the_check(tmp_path):
    assert _results(tmp_path, own_disks=False) == [{"left": []}, {"left": []}]


def test_a_directory_each_node_has_its_own_of_is_refused_on_every_rank(tmp_path):
    for result in _results(tmp_path, own_disks=True):
        assert "is not the same on every node: rank(s) 1 do not see" in result["error"], result
        assert "--no-checkpoints" in result["error"]


def test_two_torchrun_nodes_with_their_own_run_dirs_are_refused_before_the_first_step(
        corpus, tmp_path):
    """`--run-dir run` from each node's own working directory: two directories, as on two
    machines' local disks. Both nodes stop at the start and say why."""
    from .conftest import micro_config

    cfg = micro_config(*corpus, steps=4)
    cfg.save(tmp_path / "run.yaml")
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1"}
    port = str(29700 + os.getpid() % 200)
    procs = []
    for node in (0, 1):
        where = tmp_path / f"node_{node}"
        where.mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
             str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
             port, "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"),
             "--dp", "2", "--run-dir", "run", "--no-progress"],
            cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    said = [p.communicate(timeout=240)[1] for p in procs]
    for node, (p, err) in enumerate(zip(procs, said)):
        assert p.returncode != 0, err
        assert "is not the same on every node: rank(s) 1 do not see" in err, (node, err[-2000:])
        assert not (tmp_path / f"node_{node}" / "run" / "metrics.jsonl").exists()
