"""Carried updates (--update carried: SU on the host update thread, WU in the next step)
compute the same run as inline updates: the same AdamW steps with the same learning rates and
clipping coefficients, only later in time. Evaluation (every 5 steps) and the final checkpoint
read the masters while an update may still run: they must wait for it."""

from __future__ import annotations

import json

import pytest
import torch

from ratrain import checkpoint
from ratrain.runtime.launch import launch_local
from ratrain.runtime.stage import Stage
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.plan import build_plan
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main

from .conftest import micro_config, one_thread

pytestmark = pytest.mark.dist

STEPS = 10


def _run(corpus, run_dir, pp, dp, update, clip):
    cfg = micro_config(*corpus, steps=STEPS)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.update = pp, dp, update
    cfg.parallel.schedule = "1f1b"
    cfg.parallel.state_home = "host"  # the executor, where a single process has none otherwise
    cfg.train.grad_clip = 1.0 if clip else 0.0
    cfg.train.eval_every = 5
    args = (cfg, str(run_dir), False, False, False)
    if pp * dp == 1:
        with one_thread():
            rank_main(*args)
    else:
        launch_local(pp * dp, rank_main, args, error_dir=run_dir / "errors")
    ckpt = checkpoint.latest(run_dir)
    units = checkpoint.load_units(ckpt, range(cfg.model.n_units), torch.device("cpu"))
    plan = checkpoint.load_meta(ckpt)["plan"]
    return read_metrics(run_dir / "metrics.jsonl"), units, plan


@pytest.mark.parametrize("clip", [True, False], ids=["clip", "noclip"])
@pytest.mark.parametrize("pp, dp", [(1, 1), (2, 2)])
def test_carried_updates_compute_the_inline_run(pp, dp, clip, corpus, tmp_path):
    rows, units, plan = _run(corpus, tmp_path / "carried", pp, dp, "carried", clip)
    ref_rows, ref_units, ref_plan = _run(corpus, tmp_path / "inline", pp, dp, "inline", clip)
    assert plan["update"] == "carried" and "update" not in ref_plan
    assert all("SU" in p and "WU" in p for p in plan["programs"])
    assert all(" U" in p for p in ref_plan["programs"])
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref_rows]
    assert [r.get("val_loss") for r in rows] == [r.get("val_loss") for r in ref_rows]
    assert [r["lr"] for r in rows] == [r["lr"] for r in ref_rows]
    assert ref_rows[-1]["loss"] < ref_rows[0]["loss"] - 0.5  # the run trained
    for u, state in ref_units.items():
        for name, w in state["weights"].items():
            assert torch.equal(units[u]["weights"][name], w), (u, name)


def _host_run(corpus, run_dir, group: int, update: str, device_units=(),
              host_grad_dtype="float32"):
    """A single-process run of a host-homed plan (recompute, window 1); (run dir, plan)."""
    cfg = micro_config(*corpus, steps=STEPS)
    plan = build_plan(cfg.model.n_layers, 1, 1, cfg.n_micro, activation="recompute",
                      view_window=1, state_home="host", micro_batch_group=group,
                      update=update, device_units=device_units, host_grad_dtype=host_grad_dtype)
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.parallel.state_home, cfg.parallel.plan_file = "host", str(run_dir / "plan.json")
    cfg.parallel.host_grad_dtype = host_grad_dtype
    with one_thread():
        rank_main(cfg, str(run_dir), False, False, False)
    return run_dir, plan


@pytest.mark.parametrize("group", [1, 2])
def test_host_folds_and_norms_on_the_update_thread_change_nothing(group, corpus, tmp_path,
                                                                   monkeypatch):
    """The GPU's fold path (a host accumulation whose later folds are added lazily: the last
    one by SN on the update thread, beside the walker's folds of other units), unit-major
    groups or not, clipping on: carried computes inline's run bit for bit."""
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    runs = {}
    for update in ("inline", "carried"):
        runs[update], plan = _host_run(corpus, tmp_path / update, group=group, update=update)
        assert (Action(Op.START_NORM, 1) in plan.programs[0]) == (update == "carried")
    rows, ref = (read_metrics(runs[u] / "metrics.jsonl") for u in ("carried", "inline"))
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]
    assert [r["grad_norm"] for r in rows] == [r["grad_norm"] for r in ref]
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5


def test_units_kept_on_the_device_compute_the_all_host_run(corpus, tmp_path, monkeypatch):
    """--device-units on the GPU's fold path (the other units' state across a host link, run
    here on the CPU): the device units fold, measure and update inline where they are, the
    rest on the update thread; the run is the all-host inline run's."""
    on_device: set[int] = set()
    build = Stage.__init__

    def spy(self, *args, **kw):
        build(self, *args, **kw)
        on_device.update(id(self.state[u]) for u in kw.get("device_units", ()))

    monkeypatch.setattr(Stage, "__init__", spy)
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu",
                        property(lambda self: id(self) not in on_device))
    runs = {"mixed": _host_run(corpus, tmp_path / "mixed", group=2, update="carried",
                               device_units=(0, 2))[0],
            "host": _host_run(corpus, tmp_path / "host", group=2, update="inline")[0]}
    assert len(on_device) == 2
    rows, ref = (read_metrics(runs[n] / "metrics.jsonl") for n in ("mixed", "host"))
    for row, want in zip(rows, ref):
        assert row["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6)
        assert row["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5
    units = {n: checkpoint.load_units(checkpoint.latest(runs[n]), range(6), torch.device("cpu"))
             for n in runs}
    for u, state in units["host"].items():
        for name, w in state["weights"].items():
            torch.testing.assert_close(units["mixed"][u]["weights"][name], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("group", [1, 2])
def test_a_bf16_host_gradient_trains_as_the_fp32_one_to_its_rounding(group, corpus, tmp_path,
                                                                     monkeypatch):
    """--host-grad-dtype bfloat16 on the GPU's fold path, carried (each fold into the host's
    buffer rounds to bf16; the update casts each parameter's back): the host buffers are bf16
    and the run is the fp32 one's to within that rounding, step by step, clipping on (10
    steps, 2026-11-28: losses within 1.2e-4 relative)."""
    dtypes = []
    build = Stage.__init__

    def spy(self, *args, **kw):
        build(self, *args, **kw)
        dtypes.extend(s.grad.dtype for s in self.state.values() if s.grad is not None)

    monkeypatch.setattr(Stage, "__init__", spy)
    monkeypatch.setattr(UnitState, "_host_homed_on_gpu", property(lambda self: True))
    runs = {dtype: _host_run(corpus, tmp_path / dtype, group=group, update="carried",
                             host_grad_dtype=dtype)[0] for dtype in ("float32", "bfloat16")}
    assert dtypes[len(dtypes) // 2:] == [torch.bfloat16] * (len(dtypes) // 2)
    rows, ref = (read_metrics(runs[d] / "metrics.jsonl") for d in ("bfloat16", "float32"))
    assert len(rows) == len(ref) == STEPS
    # the first step's norm from the same weights: the gradient's rounding alone (a later
    # one moves more where it spikes: 5% seen at step 6, from weights 1e-4 apart)
    assert rows[0]["grad_norm"] == pytest.approx(ref[0]["grad_norm"], rel=1e-3)
    for row, want in zip(rows, ref):
        assert row["loss"] == pytest.approx(want["loss"], rel=5e-4)
    assert [r["loss"] for r in rows] != [r["loss"] for r in ref]  # rounded, not the same run
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5


def test_the_last_steps_carried_updates_are_waited_at_the_end_of_a_run(corpus, tmp_path,
                                                                       monkeypatch):
    """Without a final evaluation or checkpoint nothing read the masters after the last step,
    so its carried updates were never waited: the run ended with them still running and an
    error in them was lost. The run now waits for them, and says the error."""
    from ratrain.runtime import carried_updates

    cfg = micro_config(*corpus, steps=3)
    cfg.parallel.update, cfg.parallel.state_home, cfg.parallel.schedule = "carried", "host", "1f1b"
    cfg.train.eval_every, cfg.train.eval_batches, cfg.train.checkpoints = 0, 0, False
    updates, real = [], carried_updates._update

    def failing_in_the_last_step(state, *args):
        updates.append(state)
        if len(updates) > 2 * cfg.model.n_units:  # the third step's
            raise RuntimeError("the last step's update failed")
        return real(state, *args)

    monkeypatch.setattr(carried_updates, "_update", failing_in_the_last_step)
    with one_thread(), pytest.raises(RuntimeError, match="the last step's update failed"):
        rank_main(cfg, str(tmp_path / "run"), None, False, False)
    assert len(updates) == 3 * cfg.model.n_units
