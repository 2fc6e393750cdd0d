"""Low-communication training (--sync diloco): multi-process gloo runs compute the run of the
single-process reference (training/diloco_reference.py: the replicas in turn, plain LocalEngines,
the outer step written apart), streaming on and off, pp in {1, 2}, dp in {2, 4}, state on the
device and in host memory (its outer sync over a gloo group of its own, as on GPUs); and a
resumed run continues exactly."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ratrain import checkpoint
from ratrain.data.replica import make_data
from ratrain.data.tokenizer import load_tokenizer
from ratrain.models.llama import build_units
from ratrain.runtime.engine import LocalEngine
from ratrain.runtime.launch import launch_local
from ratrain.training.diloco_reference import run_reference
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main, train

from .conftest import assert_resumes_exactly, micro_config, one_thread, rel

pytestmark = pytest.mark.dist

STEPS = 8


def _config(corpus, pp, dp, sync, steps=STEPS, state_home="device", device_units=0):
    cfg = micro_config(*corpus, steps=steps)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.sync = pp, dp, sync
    cfg.parallel.state_home, cfg.parallel.device_units = state_home, device_units
    cfg.train.eval_batches = 0  # (validation: test_validation_evaluates_the_outer_parameters)
    return cfg


def _single_thread_reference(cfg):
    with one_thread():
        return run_reference(cfg)


def _recording_outer_groups(cfg, run_dir: str) -> None:
    """rank_main, writing down for each outer all-reduce whether it went over the stage's gloo
    group for host memory (Groups.host_replicas), not the replicas' group."""
    from ratrain.runtime import outer_sync
    from ratrain.training import run as run_module

    made, seen = {}, []
    real_init = run_module.init_groups

    def init_groups(*args, **kwargs):
        made["groups"] = real_init(*args, **kwargs)
        return made["groups"]

    class Dist:  # outer_sync's torch.distributed, its all-reduces written down
        def __getattr__(self, name):
            return getattr(dist, name)

        def all_reduce(self, tensor, group=None, **kwargs):
            g = made["groups"]
            seen.append(group is g.host_replicas and group is not g.replicas
                        and dist.get_backend(group) == "gloo")
            return dist.all_reduce(tensor, group=group, **kwargs)

    run_module.init_groups, outer_sync.dist = init_groups, Dist()
    rank_main(cfg, run_dir, None, False, False)
    Path(run_dir, f"outer_groups_{os.environ['RANK']}.json").write_text(json.dumps(seen))


@pytest.mark.parametrize("pp, dp, sync, state_home, device_units", [
    (1, 2, "diloco:2", "device", 0), (2, 2, "diloco:4:2", "device", 0),
    (1, 4, "diloco:3:3", "device", 0), (2, 4, "diloco:3", "device", 0),
    (2, 2, "diloco:4:2", "host", 0),
    (2, 2, "diloco:2", "host", 1),  # each stage's first unit's state (and outer state) on the device
])
def test_diloco_matches_the_single_process_reference(pp, dp, sync, state_home, device_units,
                                                    corpus, tmp_path):
    cfg = _config(corpus, pp, dp, sync, state_home=state_home, device_units=device_units)
    launch_local(pp * dp, _recording_outer_groups, (cfg, str(tmp_path)),
                 error_dir=tmp_path / "errors")
    for rank in range(pp * dp):
        over_host_group = json.loads((tmp_path / f"outer_groups_{rank}.json").read_text())
        assert len(over_host_group) >= 2  # (a unit per stage at least, synced twice)
        assert set(over_host_group) == {state_home == "host"}, (rank, over_host_group)
    from ratrain.setup import Machine, run_plan

    assert len(run_plan(cfg, Machine()).device_units) == device_units * pp  # (what the ranks ran)
    ref = _single_thread_reference(cfg)

    loss = torch.tensor([r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")],
                        dtype=torch.float64)
    want = torch.tensor(ref.losses, dtype=torch.float64)
    assert len(loss) == STEPS
    assert float(((loss - want).abs() / want).max()) < 1e-5, (loss, want)
    assert want[-1] < want[0] - 0.3  # it trained

    ckpt = checkpoint.latest(tmp_path)
    fresh = run_reference(cfg, steps=0)  # the initial weights: the outer steps moved them
    moved = 0.0
    for replica in (0, dp - 1):
        units = checkpoint.load_units(ckpt, range(cfg.model.n_units), "cpu", replica)
        for u, state in units.items():
            names = [n for n, _ in ref.replicas[replica].stage.modules[u].named_parameters()]
            for name, want_w in zip(names, ref.replicas[replica].stage.state[u].masters):
                assert rel(state["weights"][name], want_w.detach()) < 1e-5, (replica, u, name)
            outer = torch.cat([p.reshape(-1) for p in ref.outer[u]])
            assert rel(state["outer"]["params"], outer) < 1e-5, u
            assert rel(state["outer"]["momentum"],
                       torch.cat([m.reshape(-1) for m in ref.momentum[u]])) < 1e-5, u
            start = torch.cat([p.detach().reshape(-1) for p in fresh.outer[u]])
            moved = max(moved, rel(outer, start))
    assert moved > 1e-3  # outer steps were taken
    last = checkpoint.load_units(ckpt, [1], "cpu", dp - 1)[1]["weights"]
    first = checkpoint.load_units(ckpt, [1], "cpu", 0)[1]["weights"]
    same = all(torch.equal(first[n], last[n]) for n in first)
    # DiLoCo's last step was an outer sync (8 = 4 x 2; diloco:3: the run's final sync): the
    # replicas continue from its result, bit for bit; streaming mixes each replica's own
    # weights in, so they stay apart
    assert same == (sync.count(":") == 1), sync


def test_validation_evaluates_the_outer_parameters(corpus, tmp_path):
    """Validation under DiLoCo is of the outer parameters (the model the run exports), the
    same on every replica, not each replica's local weights (until 2026-11-27): at step 2 of
    diloco:3 they are the initial weights, at step 4 those of the sync after step 3, while the
    local weights move on, and at step 5, the last, those of the run's final sync (until
    2026-11-29 the steps after the last multiple of H were left out of the model a run ended
    with). The local weights come back bit for bit: the losses after each validation stay the
    reference's."""
    cfg = _config(corpus, 2, 2, "diloco:3", steps=5)
    cfg.train.eval_batches, cfg.train.eval_every = 2, 2
    train(cfg, tmp_path, progress=False, trace=False)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    assert sorted(val) == [2, 4, 5]

    def outer_loss(steps: int):
        """The reference's outer parameters after `steps` steps: their loss on the whole
        validation set, and the reference run."""
        with one_thread():
            ref = run_reference(cfg, steps)
            engine = LocalEngine(cfg, torch.device("cpu"))
            with torch.no_grad():
                for u, params in ref.outer.items():
                    for m, p in zip(engine.stage.state[u].masters, params):
                        m.copy_(p)
            return engine.eval_loss(make_data(cfg, load_tokenizer("byte"), 1, 0)[1]), ref

    want_5, ref = outer_loss(5)
    want_2, _ = outer_loss(2)
    assert abs(val[5] - want_5) < 1e-5 * want_5, (val[5], want_5)
    assert abs(val[2] - want_2) < 1e-5 * want_2, (val[2], want_2)
    assert abs(val[4] - val[5]) > 1e-4 and abs(val[2] - val[4]) > 1e-3, val
    loss = [r["loss"] for r in rows]
    assert all(abs(a - b) < 1e-5 * b for a, b in zip(loss, ref.losses)), (loss, ref.losses)


def test_diloco_resumes_exactly(corpus, tmp_path):
    run = assert_resumes_exactly(lambda: _config(corpus, 2, 2, "diloco:3:2", steps=6), tmp_path)
    files = checkpoint.load_meta(checkpoint.checkpoint_dir(run, 3))["files"]
    assert "unit_0001.outer.pt" in files and "unit_0001.replica_1.optim.pt" in files


def test_export_and_a_synchronous_resume_take_the_outer_parameters(corpus, tmp_path, monkeypatch,
                                                                 capsys):
    """Mid-period (diloco:3, the checkpoint of step 4 of 5) the replicas' local weights differ;
    the model a DiLoCo run exports is its outer parameters, a replica's own only when asked."""
    from ratrain.models.hf import load_hf_weights

    from ..unit.cli_runner import run_cli

    cfg = _config(corpus, 1, 2, "diloco:3", steps=5)
    cfg.train.checkpoint_every = 4
    train(cfg, tmp_path / "run", progress=False, trace=False)
    shutil.rmtree(checkpoint.checkpoint_dir(tmp_path / "run", 5))  # after the final sync
    ckpt = checkpoint.latest(tmp_path / "run")
    assert ckpt.name == "step_000004"

    def exported(*flags) -> list:
        out = tmp_path / f"hf{'_'.join(flags)}"
        code, stdout, err = run_cli(monkeypatch, capsys, "export", str(tmp_path / "run"),
                                    "--out", str(out), *flags)
        assert code == 0, err
        units = build_units(cfg.model, 123)
        load_hf_weights(units, cfg.model, out)
        return [torch.cat([p.detach().reshape(-1) for p in u.parameters()]) for u in units]

    outer = [checkpoint.load_units(ckpt, [u], "cpu")[u]["outer"]["params"]
             for u in range(cfg.model.n_units)]
    assert all(torch.equal(a, b) for a, b in zip(exported(), outer))
    names = [[n for n, _ in u.named_parameters()] for u in build_units(cfg.model, 0)]
    for replica in (0, 1):
        states = checkpoint.load_units(ckpt, range(cfg.model.n_units), "cpu", replica)
        own = [torch.cat([states[u]["weights"][n].reshape(-1) for n in names[u]])
               for u in range(cfg.model.n_units)]
        assert all(torch.equal(a, b) for a, b in zip(exported("--replica", str(replica)), own))
    assert not torch.equal(own[1], outer[1])  # (one step after the sync: apart)
    code, _, err = run_cli(monkeypatch, capsys, "export", str(tmp_path / "run"), "--out",
                           str(tmp_path / "x"), "--replica", "2")
    assert code == 2 and "has replicas 0-1" in err

    # resumed synchronously, every replica starts from the outer parameters (until 2026-11-29
    # each went on from its own local weights): at an lr too small to move a weight, the
    # synchronous checkpoint after one step holds them
    resumed = _config(corpus, 1, 2, "step", steps=5)
    resumed.train.lr = 1e-30
    train(resumed, tmp_path / "run", resume=True, progress=False, trace=False)
    after = checkpoint.load_units(checkpoint.latest(tmp_path / "run"), range(cfg.model.n_units),
                                  "cpu")
    assert checkpoint.latest(tmp_path / "run").name == "step_000005"
    for u in range(cfg.model.n_units):
        assert torch.equal(torch.cat([after[u]["weights"][n].reshape(-1) for n in names[u]]),
                           outer[u]), u


def test_a_synchronous_checkpoint_starts_diloco_from_its_weights(corpus, tmp_path):
    """A synchronous run's checkpoint has no outer state: the DiLoCo run resumed from it starts
    its outer parameters at the checkpoint's weights, with no momentum (it crashed on that
    until 2026-11-27). Its first outer step (diloco:3 resumed at step 2: after inner step 3)
    is then W - lr (g + mu g), g the replicas' mean of W - local; their local weights before
    it are those of the same resume with no sync in reach (diloco:100's checkpoint of step 3,
    before its final sync)."""
    cfg = _config(corpus, 1, 2, "step", steps=2)
    train(cfg, tmp_path / "sync", progress=False, trace=False)
    w = checkpoint.load_units(checkpoint.latest(tmp_path / "sync"), range(cfg.model.n_units),
                              "cpu")
    ends = {}
    for sync in ("diloco:3", "diloco:100"):
        run = tmp_path / sync.replace(":", "_")
        shutil.copytree(tmp_path / "sync", run)
        resumed = _config(corpus, 1, 2, sync, steps=4)
        resumed.train.checkpoint_every = 1
        train(resumed, run, resume=True, progress=False, trace=False)
        ends[sync] = checkpoint.checkpoint_dir(run, 3)
    lr, mu = cfg.train.outer_lr, cfg.train.outer_momentum
    units = build_units(cfg.model, 0)
    for u in range(cfg.model.n_units):
        order = [n for n, _ in units[u].named_parameters()]  # the outer state's order

        def flat(weights: dict) -> torch.Tensor:
            return torch.cat([weights[n].reshape(-1) for n in order])

        start = flat(w[u]["weights"])
        locals_ = [flat(checkpoint.load_units(ends["diloco:100"], [u], "cpu", r)[u]["weights"])
                   for r in (0, 1)]
        g = sum(start - x for x in locals_) / 2
        got = checkpoint.load_units(ends["diloco:3"], [u], "cpu")[u]["outer"]["params"]
        assert rel(got, start - lr * (g + mu * g)) < 1e-6, u
        assert rel(got, start) > 1e-4, u  # it moved
