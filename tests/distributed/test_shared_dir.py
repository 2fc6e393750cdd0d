"""Under torchrun the nodes may not share the checkpoint directory (node-local disks): every
rank looks for the others' files before the first step (training/shared_dir.py), and where
they see several directories each keeps its own ranks' part of every checkpoint. gloo ranks
given one directory, or each its own as machines' local disks would be; then two torchrun
nodes, each running in its own working directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ratrain import checkpoint
from ratrain.runtime.launch import launch_local

from ..unit.cli_runner import run_cli
from .conftest import micro_config
from .test_failure import losses

pytestmark = pytest.mark.dist


def _rank(out: str, node_of: list[int]) -> None:
    from ratrain.runtime.process_groups import join_world
    from ratrain.training.shared_dir import shared_by

    rank = int(os.environ["RANK"])
    join_world("gloo", 60.0)
    directory = Path(out, f"node_{node_of[rank]}", "checkpoints")
    share = shared_by(directory, rank, len(node_of), 60.0, torch.device("cpu"), look_for_s=1.0)
    dist.barrier()  # every rank removes its file once it knows what every rank saw
    result = {"ranks": list(share.ranks), "directories": share.directories,
              "left": sorted(p.name for p in directory.iterdir())}
    Path(out, f"rank_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _shares(tmp_path, node_of: list[int]) -> list[dict]:
    launch_local(len(node_of), _rank, (str(tmp_path), node_of), error_dir=tmp_path / "errors")
    return [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(len(node_of))]


def test_ranks_that_share_a_directory_find_each_other_and_leave_nothing(tmp_path):
    """Nor what a start killed during the check left (another run's file of rank 1)."""
    (tmp_path / "node_0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "node_0" / "checkpoints" / ".ratrain-shared-0123abcd-00001").write_text("x")
    assert _shares(tmp_path, [0, 0]) == [{"ranks": [0, 1], "directories": 1, "left": []}] * 2


def test_ranks_in_directories_of_their_own_are_told_apart_by_directory(tmp_path):
    got = _shares(tmp_path, [0, 1, 0, 1])
    assert [(g["ranks"], g["directories"], g["left"]) for g in got] == [
        ([0, 2], 2, []), ([1, 3], 2, []), ([0, 2], 2, []), ([1, 3], 2, [])]


def _room(out: str, free_mib: list[float]) -> None:
    """Rank r's own directory with free_mib[r] MiB free; a --sync diloco run at dp 2 on the
    tiny preset, checkpoints only at its end."""
    import shutil as shutil_module

    from ratrain.config import RunConfig
    from ratrain.errors import UserError
    from ratrain.runtime.process_groups import join_world
    from ratrain.schedule.grid import RankGrid
    from ratrain.training.disk_room import check_room_together
    from ratrain.training.shared_dir import shared_by

    rank = int(os.environ["RANK"])
    usage = shutil_module.disk_usage(out)
    shutil_module.disk_usage = lambda path: usage._replace(free=int(free_mib[rank] * 2**20))
    join_world("gloo", 60.0)
    cfg = RunConfig()
    cfg.parallel.dp, cfg.parallel.sync, cfg.train.checkpoint_every = 2, "diloco:50", 0
    directory = Path(out, f"node_{rank}")
    share = shared_by(directory / "checkpoints", rank, 2, 60.0, torch.device("cpu"),
                      look_for_s=1.0)
    try:
        check_room_together(cfg, directory, directory, share, RankGrid(1, 2),
                            [range(cfg.model.n_units)], rank, False, torch.device("cpu"))
        said = "room"
    except UserError as e:
        said = str(e)
    Path(out, f"rank_{rank}.json").write_text(json.dumps(said))
    dist.destroy_process_group()


def test_each_node_is_asked_for_room_for_its_own_part_and_all_stop_where_one_lacks_it(tmp_path):
    """The default model's whole DiLoCo checkpoint at dp 2 is 32 bytes a parameter (110 MB);
    a node's part 20 (69 MB): 80 MiB is room enough for a node; 60 MiB is not, on every rank."""
    from ratrain.config import RunConfig
    from ratrain.planner.account import decimal_bytes
    from ratrain.training.disk_room import checkpoint_bytes

    cfg = RunConfig()
    cfg.parallel.dp, cfg.parallel.sync = 2, "diloco:50"
    whole = checkpoint_bytes(cfg) / 2**20
    assert whole > 100
    results = []
    for free in ([80, 80], [80, 60]):
        launch_local(2, _room, (str(tmp_path), free), error_dir=tmp_path / "errors")
        results.append([json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)])
    assert results[0] == ["room", "room"]
    for said in results[1]:
        assert said.startswith(
            f"not enough disk space for {tmp_path / 'node_1'}: 62.91 MB free, a checkpoint of "
            f"{cfg.model.name} (the part of ranks 1, whose directory it is) takes about "
            f"{decimal_bytes(whole * 2**20 * 20 / 32)}"), said


def _nodes(tmp_path: Path, corpus, *args: str, ok: bool = True,
           timeout_s: float = 300, per_node: int = 1) -> list[str]:
    """`ratrain train` on two torchrun nodes of `per_node` ranks each, each with `--run-dir
    run` in its own working directory (two directories, as two machines' local disks); their
    stderr, once both ended as `ok` says."""
    env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1",
           "RATRAIN_SHARED_DIR_WAIT_S": "2"}  # (local directories: 10 s a start for nothing)
    port = str(29700 + os.getpid() % 200)
    procs = []
    for node in (0, 1):
        where = tmp_path / f"node_{node}"
        where.mkdir(exist_ok=True)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
             str(node), "--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1",
             "--master-port",
             port, "-m", "ratrain.cli", "train", "--config", str(tmp_path / "run.yaml"),
             "--run-dir", "run", "--no-progress", *args],
            cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    said = [p.communicate(timeout=timeout_s)[1] for p in procs]
    for node, (p, err) in enumerate(zip(procs, said)):
        assert (p.returncode == 0) == ok, (node, err[-3000:])
    return said


def _parts_saved_and_resumed(corpus, tmp_path) -> dict[int, float]:
    """--sync diloco over two nodes: each node's directory holds its replica's units and the
    outer states. With step 6 gone on node 0 (node 1's is newer than rank 0's newest) and a
    file of node 1's step 4 altered, the resume agrees on step 2, the newest both hold whole,
    and repeats the first run's losses exactly."""
    cfg = micro_config(*corpus, steps=6)
    cfg.train.checkpoint_every, cfg.train.keep_checkpoints, cfg.train.eval_every = 2, 3, 0
    cfg.save(tmp_path / "run.yaml")
    sync = ("--dp", "2", "--sync", "diloco:2")
    said = _nodes(tmp_path, corpus, *sync)
    assert "is not the same on every node: the ranks see 2 directories" in said[0]
    ckpts = [tmp_path / f"node_{n}" / "run" / "checkpoints" for n in (0, 1)]
    for node, ckpts_here in enumerate(ckpts):
        assert [c.name for c in checkpoint.complete_dirs(checkpoint.Elsewhere(ckpts_here))] == [
            "step_000002", "step_000004", "step_000006"]
        meta = checkpoint.load_meta(ckpts_here / "step_000002")
        assert meta["ranks"] == [node] and sorted(meta["rng"]) == [str(node)]
        names = set(meta["files"])
        n_units = len([n for n in names if n.endswith(".outer.pt")])
        assert n_units >= 3 and all(f"unit_{u:04d}.outer.pt" in names for u in range(n_units))
        assert all((".replica_1." in n) == (node == 1) for n in names if n.endswith(".safetensors"))
    first = losses(tmp_path / "node_0" / "run")
    assert sorted(first) == list(range(1, 7))
    shutil.rmtree(ckpts[0] / "step_000006")
    altered = ckpts[1] / "step_000004" / "unit_0001.replica_1.safetensors"
    data = bytearray(altered.read_bytes())
    data[-1] ^= 0xFF
    altered.write_bytes(data)
    said = _nodes(tmp_path, corpus, *sync, "--resume", "auto")
    assert "skipping checkpoint step_000004: rank 1: checkpoint " in said[0], said[0][-3000:]
    assert "unit_0001.replica_1.safetensors does not match its sha256" in said[0]
    assert "resuming from step_000002, the newest checkpoint every node's directory holds " \
           "whole" in said[0]
    assert losses(tmp_path / "node_0" / "run") == first
    return first


def test_diloco_nodes_without_a_shared_disk_save_parts_resume_exactly_and_merge_them(
        corpus, tmp_path, monkeypatch, capsys):
    """_parts_saved_and_resumed; then `ratrain merge-parts` of the two nodes' run directories
    at step 4: one checkpoint, every file verified, which pp 2 x dp 2 in local processes
    resumes to the first run's losses (another layout: within 1e-5)."""
    first = _parts_saved_and_resumed(corpus, tmp_path)
    for n in (0, 1):
        shutil.rmtree(tmp_path / f"node_{n}" / "run" / "checkpoints" / "step_000006")
    merged = tmp_path / "merged"
    code, out, err = run_cli(monkeypatch, capsys, "merge-parts", str(tmp_path / "node_0" / "run"),
                             str(tmp_path / "node_1" / "run"), "--out", str(merged))
    assert code == 0 and "merged step_000004 of 2 parts" in out, err
    ckpt = checkpoint.latest(merged)
    meta = checkpoint.load_meta(ckpt)
    assert ckpt.name == "step_000004" and "ranks" not in meta and sorted(meta["rng"]) == ["0", "1"]
    assert {n for n in meta["files"] if ".replica_1." in n} and checkpoint.missing_units(
        ckpt, range(6), replica=1) == []
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(merged), "--pp", "2",
                           "--no-progress")
    assert code == 0, err
    got = losses(merged)
    assert sorted(got) == list(range(1, 7))
    for step in (5, 6):
        assert abs(got[step] - first[step]) <= 1e-5 * abs(first[step]), (step, got, first)
    code, _, err = run_cli(monkeypatch, capsys, "merge-parts", str(tmp_path / "node_0" / "run"),
                           str(tmp_path / "node_0" / "run"), "--out", str(tmp_path / "twice"))
    assert code == 2 and "a node's part was given twice" in err, err


def test_islands_on_nodes_without_a_shared_disk_each_keep_their_islands_part(corpus, tmp_path):
    """dp 4 in 2 islands, a node each (--sync diloco:2:islands=2): each node's directory holds
    its island's units once (island 1's under replica 1's names) and the outer states, written
    by the island's first replica; both resume in place to the first run's losses exactly."""
    cfg = micro_config(*corpus, steps=4)
    cfg.train.checkpoint_every, cfg.train.eval_every = 2, 0
    cfg.save(tmp_path / "run.yaml")
    sync = ("--dp", "4", "--global-batch", "16", "--sync", "diloco:2:islands=2")
    _nodes(tmp_path, corpus, *sync, per_node=2)
    for node in (0, 1):
        meta = checkpoint.load_meta(tmp_path / f"node_{node}" / "run" / "checkpoints" / "step_000002")
        assert meta["ranks"] == [2 * node, 2 * node + 1]
        weights = {n for n in meta["files"] if n.endswith(".safetensors")}
        assert weights and all((".replica_1." in n) == (node == 1) for n in weights), weights
        assert not any(".replica_2." in n or ".replica_3." in n for n in meta["files"])
        assert "unit_0001.outer.pt" in meta["files"]
    first = losses(tmp_path / "node_0" / "run")
    for node in (0, 1):
        shutil.rmtree(tmp_path / f"node_{node}" / "run" / "checkpoints" / "step_000004")
    _nodes(tmp_path, corpus, *sync, "--resume", "auto", per_node=2)
    assert losses(tmp_path / "node_0" / "run") == first


def test_synchronous_replicas_without_a_shared_disk_each_keep_a_whole_copy(corpus, tmp_path):
    """A synchronous run's replicas hold the same units: node 1's directory, which holds no
    replica 0, gets its replica's copy, under replica 0's names, the same bytes as node 0's."""
    cfg = micro_config(*corpus, steps=2)
    cfg.train.eval_every = 0
    cfg.save(tmp_path / "run.yaml")
    _nodes(tmp_path, corpus, "--dp", "2")
    metas = [checkpoint.load_meta(tmp_path / f"node_{n}" / "run" / "checkpoints" / "step_000002")
             for n in (0, 1)]
    assert [m["ranks"] for m in metas] == [[0], [1]]
    assert metas[0]["files"] == metas[1]["files"] and "unit_0000.safetensors" in metas[1]["files"]


def test_a_tied_head_on_another_node_than_its_embedding_is_refused_at_the_start(corpus, tmp_path):
    """The head stage reads the embedding's unit at a resume, which only stage 0's node would
    hold: every node stops before the first step instead of saving what cannot resume."""
    cfg = micro_config(*corpus, steps=2)
    cfg.model.tie_embeddings = True
    cfg.save(tmp_path / "run.yaml")
    for err in _nodes(tmp_path, corpus, "--pp", "2", ok=False):
        assert "rank 1 reads unit 0 at a resume (a tied embedding's copy)" in err, err[-3000:]
    assert not (tmp_path / "node_0" / "run" / "metrics.jsonl").exists()


def test_a_node_stopped_before_the_ranks_join_stops_the_others_with_its_reason(corpus, tmp_path):
    """A relative data path that only node 0's working directory holds: node 1 stops at its
    data check, before the ranks join. It joins only to say so, and node 0 stops at once with
    node 1's reason (it waited --comm-timeout, 300 s, to join a rank that was gone)."""
    cfg = micro_config(*corpus, steps=2)
    cfg.data.path = "text"
    cfg.save(tmp_path / "run.yaml")
    (tmp_path / "node_0").mkdir()
    (tmp_path / "node_0" / "text").symlink_to(corpus[0])
    said = _nodes(tmp_path, corpus, "--dp", "2", ok=False, timeout_s=120)
    reason = next(line for line in said[1].splitlines() if line.startswith("error: "))
    assert reason == "error: data path not found: text", said[1][-3000:]
    assert [line for line in said[0].splitlines() if line.startswith(("error: ", "("))] == [
        "error: rank 1 stopped before training: data path not found: text"], said[0][-3000:]
