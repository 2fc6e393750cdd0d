"""Hierarchical DiLoCo (--sync diloco:...:islands=K): dp = 4 replicas in 2 islands of 2, each
island synchronous inside (its gradients summed every step), the islands DiLoCo's workers. The
run computes the single-process reference of plain DiLoCo with 2 replicas (an island's rows are
one such replica's batch), each replica carries half of a unit's delta across the islands and
the island gathers the sums; a resumed run continues exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ratrain import checkpoint
from ratrain.runtime.launch import launch_local
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.ir import Op
from ratrain.schedule.plan import build_plan
from ratrain.setup import Machine, run_plan
from ratrain.setup.memory_fit import stage_bytes
from ratrain.sim.profile import load_profile
from ratrain.training.diloco_reference import run_reference
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main

from .conftest import assert_resumes_exactly, micro_config, one_thread, rel

pytestmark = pytest.mark.dist

STEPS = 6


def _config(corpus, sync, state_home="device", steps=STEPS, shard_state=False, pp=1):
    cfg = micro_config(*corpus, steps=steps)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.sync = pp, 4, sync
    cfg.parallel.state_home, cfg.parallel.shard_state = state_home, shard_state
    cfg.train.eval_batches = 0
    return cfg


def _recording_outer_traffic(cfg, run_dir: str) -> None:
    """rank_main, writing down each outer all-reduce's and all-gather's group (as the stage's
    replica indices in it) and how many values it carried."""
    from ratrain.runtime import outer_sync
    from ratrain.training import run as run_module

    seen = []

    class Dist:  # outer_sync's torch.distributed, its collectives written down
        def __getattr__(self, name):
            return getattr(dist, name)

        def all_reduce(self, tensor, group=None, **kwargs):
            seen.append(["all_reduce", dist.get_process_group_ranks(group), tensor.numel(),
                         dist.get_backend(group)])
            return dist.all_reduce(tensor, group=group, **kwargs)

        def all_gather(self, tensors, tensor, group=None, **kwargs):
            seen.append(["all_gather", dist.get_process_group_ranks(group), tensor.numel(),
                         dist.get_backend(group)])
            return dist.all_gather(tensors, tensor, group=group, **kwargs)

    outer_sync.dist = Dist()
    run_module.rank_main(cfg, run_dir, None, False, False)
    Path(run_dir, f"outer_traffic_{os.environ['RANK']}.json").write_text(json.dumps(seen))


@pytest.mark.parametrize("pp, sync, state_home, shard_state, tolerance", [
    (1, "diloco:2:islands=2", "device", False, 1e-5),
    (1, "diloco:3:3:islands=2", "host", False, 1e-5),  # streaming; gloo groups of their own
    # a bf16 delta's last bit (2**-8 of it) follows the order the island sums its gradients in,
    # which is not the reference's
    (1, "diloco:2:bf16:islands=2", "device", False, 1e-4),
    # each island's state (and outer state) sharded over its two replicas
    (1, "diloco:3:3:islands=2", "device", True, 1e-5),
    (2, "diloco:2:islands=2", "device", False, 1e-5),  # each stage's replicas in islands
])
def test_islands_compute_diloco_over_the_islands(pp, sync, state_home, shard_state, tolerance,
                                                 corpus, tmp_path):
    cfg = _config(corpus, sync, state_home, shard_state=shard_state, pp=pp)
    grid = RankGrid(pp, 4)
    launch_local(pp * 4, _recording_outer_traffic, (cfg, str(tmp_path)),
                 error_dir=tmp_path / "errors")
    with one_thread():
        ref = run_reference(cfg)
    assert len(ref.replicas) == 2  # the islands

    loss = torch.tensor([r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")],
                        dtype=torch.float64)
    want = torch.tensor(ref.losses, dtype=torch.float64)
    assert len(loss) == STEPS
    assert float(((loss - want).abs() / want).max()) < 1e-5, (loss, want)

    unit_sizes = [sum(p.numel() for p in m.parameters()) for m in ref.replicas[0].stage.modules.values()]
    for rank in range(pp * 4):
        traffic = json.loads((tmp_path / f"outer_traffic_{rank}.json").read_text())
        reduces = [t for t in traffic if t[0] == "all_reduce"]
        gathers = [t for t in traffic if t[0] == "all_gather"]
        assert reduces, traffic
        # across the islands: this replica and its place in the other island; within: its own
        stage, replica = grid.coords(rank)
        ranks, first = grid.replica_ranks(stage), replica - replica % 2
        assert {tuple(t[1]) for t in reduces} == {(ranks[replica % 2], ranks[replica % 2 + 2])}
        assert {tuple(t[1]) for t in gathers} <= {(ranks[first], ranks[first + 1])}
        assert {t[3] for t in traffic} == {"gloo"}
        # half of a unit's delta crosses from each replica (padded to an even count; sharded:
        # its shard's, with nothing to gather)
        assert {t[2] for t in reduces} <= {-(-n // 2) for n in unit_sizes}, (traffic, unit_sizes)
        assert not gathers if shard_state else len(gathers) == len(reduces), traffic

    _assert_ledger_is_predicted(tmp_path, cfg)
    ckpt = checkpoint.latest(tmp_path)
    files = checkpoint.load_meta(ckpt)["files"]
    assert "unit_0001.replica_1.safetensors" in files  # island 1's local state
    assert not any("replica_2" in f or "replica_3" in f for f in files), sorted(files)
    for island in (0, 1):
        units = checkpoint.load_units(ckpt, range(cfg.model.n_units), "cpu", island)
        for u, state in units.items():
            names = [n for n, _ in ref.replicas[island].stage.modules[u].named_parameters()]
            for name, want_w in zip(names, ref.replicas[island].stage.state[u].masters):
                assert rel(state["weights"][name], want_w.detach()) < tolerance, (island, u, name)
            outer = torch.cat([p.reshape(-1) for p in ref.outer[u]])
            assert rel(state["outer"]["params"], outer) < tolerance, u


def _assert_ledger_is_predicted(run_dir, cfg) -> None:
    """Every rank's ledger at its peak, kind by kind, is what the run's memory check predicts
    (setup/memory_fit.stage_bytes: the inner step and the synced steps, with the deltas);
    sharded, the first replica of each island's: the prediction is of the first slice (the
    others' slices meet other parameters, whose AdamW step counters differ by a few bytes)."""
    plan = run_plan(cfg, Machine())  # (what the ranks ran)
    predicted = stage_bytes(cfg, plan, load_profile("cpu-local"))
    summary = json.loads((run_dir / "summary.json").read_text())
    grid = RankGrid(cfg.parallel.pp, cfg.parallel.dp)
    for rank, at_peak in enumerate(summary["ledger_at_peak_by_kind_per_rank"]):
        stage, replica = grid.coords(rank)
        if cfg.parallel.shard_state and replica % cfg.parallel.island_size:
            continue
        want = predicted[stage]
        assert want.total == sum(at_peak.values()), (rank, want, at_peak)
        assert ({k: v for k, v in want.at_peak.items() if v}
                == {k: v for k, v in at_peak.items() if v}), rank


def test_islands_sum_host_gradients_on_the_device_where_nccl_would(corpus, tmp_path):
    """State in host memory on GPUs: each island's per-step sum runs on the device before the
    fold (device_grad_sum, as NCCL needs), the outer sync over gloo; the same run."""
    sync = "diloco:2:islands=2"
    cfg = _config(corpus, sync, "host")
    plan = build_plan(cfg.model.n_layers, 1, 4, cfg.n_micro, view_window=1,
                      state_home="host", micro_batch_group=cfg.n_micro,
                      device_grad_sum=True, sync=sync)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.parallel.plan_file = str(tmp_path / "plan.json")
    launch_local(4, rank_main, (cfg, str(tmp_path), False, False, False),
                 error_dir=tmp_path / "errors")
    assert any(a.op is Op.GRAD_SYNC for a in plan.programs[0])
    with one_thread():
        ref = run_reference(_config(corpus, sync, "host"))
    loss = [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert len(loss) == STEPS
    assert all(abs(a - b) < 1e-5 * b for a, b in zip(loss, ref.losses)), (loss, ref.losses)


@pytest.mark.parametrize("shard_state", [False, True])
def test_islands_resume_exactly(shard_state, corpus, tmp_path):
    assert_resumes_exactly(lambda: _config(corpus, "diloco:2:islands=2", shard_state=shard_state),
                           tmp_path)
