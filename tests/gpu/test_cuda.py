"""CUDA paths: the same engines on a GPU. Skipped where there is no CUDA device."""

from __future__ import annotations

import gc

import pytest
import torch

from ratrain.config import RunConfig
from ratrain.models.llama import build_units
from ratrain.runtime.engine import LocalEngine, PipelineEngine
from ratrain.runtime import handlers
from ratrain.schedule.ir import Op
from ratrain.schedule.plan import build_plan

from .small_runs import corpus, run_losses, small_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


_cfg = small_config


def _batches(cfg: RunConfig, step: int):
    g = torch.Generator().manual_seed(step)
    n = cfg.train.global_batch // cfg.train.micro_batch_size
    out = []
    for _ in range(n):
        w = torch.randint(0, 64, (cfg.train.micro_batch_size, cfg.train.seq_len + 1), generator=g)
        out.append((w[:, :-1], w[:, 1:]))
    return out


def test_fp32_on_cuda_matches_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = _cfg("float32")
    cpu = LocalEngine(cfg, torch.device("cpu"), build_units(cfg.model, 0))
    gpu = LocalEngine(cfg, torch.device("cuda"), build_units(cfg.model, 0))
    for step in range(5):
        a = cpu.train_step(_batches(cfg, step), 1e-3).loss
        b = gpu.train_step(_batches(cfg, step), 1e-3).loss
        assert abs(a - b) / a < 1e-4, (step, a, b)


def test_bf16_autocast_trains():
    cfg = _cfg("bfloat16")
    engine = LocalEngine(cfg, torch.device("cuda"))
    losses = [engine.train_step(_batches(cfg, 0), 3e-3).loss for _ in range(20)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 1.0  # memorizes one batch
    assert engine.peak_memory_bytes() > 0
    # masters stay fp32 under autocast
    assert all(p.dtype == torch.float32 for p in engine.stage.master_params())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank")
def test_nccl_pipeline_matches_single_process(tmp_path, monkeypatch):
    text = corpus(tmp_path, monkeypatch)
    losses = {}
    for pp in (1, 2):
        cfg = _cfg("float32")
        cfg.data.path, cfg.train.steps, cfg.parallel.pp = str(text), 5, pp
        losses[pp] = run_losses(cfg, tmp_path / f"pp{pp}")
    assert max(abs(a - b) / a for a, b in zip(losses[1], losses[2])) < 1e-4


def _executor(cfg: RunConfig, activation: str, window: int | None, home: str,
              **plan_args) -> PipelineEngine:
    plan = build_plan(cfg.model.n_layers, 1, 1, cfg.n_micro, activation=activation,
                      view_window=window, state_home=home, clip=True, **plan_args)
    return PipelineEngine(cfg, plan, None, device=torch.device("cuda"),
                          modules=build_units(cfg.model, 0))


def _losses(engine, cfg: RunConfig, steps: int = 8) -> list[float]:
    return [engine.train_step(_batches(cfg, step), 1e-3).loss for step in range(steps)]


def test_views_offload_and_host_masters_match_a_plain_fp32_run():
    """fp32 views made from pinned host masters on the copy stream, one unit ahead, and saved
    activations offloaded and reloaded there: the same run as the plain engine on the GPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = _cfg("float32")
    plain = LocalEngine(cfg, torch.device("cuda"), build_units(cfg.model, 0))
    lifecycle = _executor(cfg, "offload", 1, "host")
    assert any(a.op is Op.OFFLOAD for a in lifecycle.program)
    assert all(m.device.type == "cpu" and m.is_pinned() for m in lifecycle.stage.master_params())
    for a, b in zip(_losses(plain, cfg), _losses(lifecycle, cfg)):
        assert abs(a - b) / a < 1e-5, (a, b)


@pytest.mark.parametrize("group, device_units", [(1, ()), (2, ()), (2, (0, 2))])
def test_carried_updates_groups_and_device_units_match_a_plain_fp32_run(group, device_units):
    """Host AdamW on the update thread (SU/WU, SN), unit-major groups (a run's fp32 sum held on
    the device, folded once), some units' state kept on the device (--device-units): the
    same run as the plain engine on the GPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = _cfg("float32")
    plain = LocalEngine(cfg, torch.device("cuda"), build_units(cfg.model, 0))
    lifecycle = _executor(cfg, "recompute", 1, "host", update="carried",
                          micro_batch_group=group, device_units=device_units)
    for u, state in lifecycle.stage.state.items():
        assert all(m.is_cuda == (u in device_units) for m in state.masters), u
    for a, b in zip(_losses(plain, cfg), _losses(lifecycle, cfg)):
        assert abs(a - b) / a < 1e-5, (a, b)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_views_match_a_plain_run_of_the_same_dtype(dtype):
    """bf16/fp16 views, offload and host masters against resident views on the device (the plain
    run of the same dtype): within 2%; fp16 with its loss scale."""
    cfg = _cfg(dtype)
    plain = _executor(cfg, "keep", 0, "device")
    lifecycle = _executor(cfg, "offload", 1, "host")
    ref, got = _losses(plain, cfg), _losses(lifecycle, cfg)
    assert max(abs(a - b) / a for a, b in zip(ref, got)) < 0.02, (ref, got)
    assert got[-1] < got[0]
    assert all(p.dtype == torch.float32 for p in lifecycle.stage.master_params())
    if dtype == "float16":
        assert lifecycle.loss_scale.scale > 0


def _weights(engine) -> list[torch.Tensor]:
    return [p.detach().cpu() for p in engine.stage.master_params()]


@pytest.mark.parametrize("activation, window, home", [
    ("keep", None, "device"), ("recompute", 1, "host"), ("offload", 1, "host"),
])
def test_split_backward_on_cuda_equals_the_whole_one(activation, window, home):
    """zbh1, both BW placements: in the bubble, each backward as two autograd calls on the GPU
    (the input gradient, then the weight gradients from the seeds it kept); grouped, the
    backward unit-major. With views from pinned host masters and offload on the copy stream:
    1f1b's losses and weights. Not bit for bit: the embedding's backward on CUDA accumulates
    with atomics."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = _cfg("float32")
    whole = _executor(cfg, activation, window, home)
    ref_losses, ref_weights = _losses(whole, cfg, 5), _weights(whole)
    for weight_grad in ("bubble", "grouped"):
        split = _executor(cfg, activation, window, home, schedule="zbh1", weight_grad=weight_grad)
        # one stage, grouped: the backward unit-major, whole (nothing there needs the split)
        assert any(a.op is Op.BACKWARD_WEIGHT for a in split.program) == (weight_grad == "bubble")
        losses = _losses(split, cfg, 5)
        assert max(abs(a - b) / a for a, b in zip(ref_losses, losses)) < 1e-5, weight_grad
        for a, b in zip(ref_weights, _weights(split)):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_split_backward_in_low_precision_trains_as_the_whole_one(dtype):
    """bf16/fp16 views, offload and host masters under zbh1 grouped: within 1% of 1f1b on the
    same plan (fp16 unscales the gradients BW accumulates with the same loss scale)."""
    cfg = _cfg(dtype)
    ref = _losses(_executor(cfg, "offload", 1, "host"), cfg)
    split = _executor(cfg, "offload", 1, "host", schedule="zbh1", weight_grad="grouped")
    got = _losses(split, cfg)
    assert max(abs(a - b) / a for a, b in zip(ref, got)) < 0.01, (ref, got)
    assert got[-1] < got[0]
    if dtype == "float16":
        assert split.loss_scale.scale > 0


@pytest.mark.parametrize("home", ["host", "device"])
def test_viewed_weights_reach_the_device_only_as_views(home):
    """Building the engine copies each viewed unit's masters to their home from the host-built
    module: the device holds no fp32 copy of the stage's weights on the way (it did: the whole
    stage's fp32 weights were the device's peak before the first step, 4.3 GB of a 4-block
    llama2-7b whose step needed less)."""
    cfg = _cfg("bfloat16")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    engine = _executor(cfg, "keep", 1, home)
    fp32_bytes = 4 * sum(m.numel() for m in engine.stage.master_params())
    built_peak = torch.cuda.max_memory_allocated() - before
    on_device = 0 if home == "host" else fp32_bytes + fp32_bytes  # masters and gradients
    assert built_peak < on_device + fp32_bytes // 4, (built_peak, fp32_bytes)
    assert all(p.numel() == 0 for s in engine.stage.state.values() for p in s.params)
    assert _losses(engine, cfg, 2)[-1] > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_copies_across_devices_and_dtypes_are_cast_on_the_device_bit_for_bit(monkeypatch, dtype):
    """A host-homed view (pinned fp32 into a low-precision device tensor), and a gradient on
    its way into a host fp32 accumulation, cross the link in fp32, chunk by chunk through a
    staging buffer of the stream they run on, and are cast on the device: the same bits as
    the cast on the host, for a size that is no multiple of the chunk."""
    from ratrain.runtime import copy_engine

    monkeypatch.setattr(copy_engine, "CAST_CHUNK", 1000)
    copies = copy_engine.CopyEngine(torch.device("cuda"))
    src = torch.randn(37, 101, generator=torch.Generator().manual_seed(0)).pin_memory()
    view = torch.empty(src.shape, dtype=dtype, device="cuda")
    copies.wait(copies.copy(view, src))
    assert torch.equal(view.cpu(), src.to(dtype))
    back = torch.empty(src.shape, pin_memory=True)
    copies.copy(back, view, gradient=True).synchronize()
    assert torch.equal(back, src.to(dtype).float())
    for stream in (copies.stream, copies.grad_stream):
        staging = copies._staging[stream]
        assert staging.numel() == 1000 and staging.dtype == torch.float32


def test_offload_lowers_the_measured_peak():
    cfg = _cfg("bfloat16")
    cfg.train.seq_len, cfg.model.max_seq_len = 512, 512
    peaks = {}
    for activation in ("keep", "offload"):
        gc.collect()  # what an earlier engine left is not this one's peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        engine = _executor(cfg, activation, 1, "host")
        _losses(engine, cfg, 3)
        peaks[activation] = torch.cuda.max_memory_allocated() - before
        del engine
    assert peaks["offload"] < peaks["keep"], peaks


def _pinned(cfg: RunConfig, step: int):
    """Pinned, so the copies to the device are asynchronous as the loader's would be."""
    return [(x.contiguous().pin_memory(), y.contiguous().pin_memory()) for x, y in _batches(cfg, step)]


@pytest.mark.parametrize("dtype,activation,schedule", [
    ("bfloat16", "recompute", {}), ("float16", "keep", {}),
    ("bfloat16", "recompute", {"schedule": "zbh1", "weight_grad": "grouped"}),
    ("float16", "offload", {"schedule": "zbh1", "weight_grad": "bubble"}),
])
def test_a_step_synchronizes_only_at_its_end(monkeypatch, dtype, activation, schedule):
    """On CUDA the host waits only where the program reads a value: a training step of the
    executor runs under torch's sync debug mode "error" (a host-device synchronization raises)
    everywhere but its end, which reads the loss, norm and overflow flag in one transfer."""
    cfg = _cfg(dtype)
    cfg.train.grad_clip = 1.0
    n_micro = cfg.train.global_batch // cfg.train.micro_batch_size
    plan = build_plan(cfg.model.n_layers, 1, 1, n_micro, policy="ratrain", activation=activation,
                      clip=True, view_window=1, **schedule)
    engine = PipelineEngine(cfg, plan, None, device=torch.device("cuda"))
    engine.train_step(_pinned(cfg, 0), 1e-3)  # first step: optimizer state, allocator warm-up
    result = _step_synchronized_only_at_its_end(engine, cfg, monkeypatch)
    assert result.grad_norm is not None and result.grad_norm > 0


def _step_synchronized_only_at_its_end(engine, cfg: RunConfig, monkeypatch):
    """One training step under torch's sync debug mode "error" everywhere but its end."""
    torch.cuda.synchronize()
    step_end = handlers.HANDLERS[Op.STEP_END]
    ended = []

    def relaxed_end(ex, st, a):
        torch.cuda.set_sync_debug_mode(0)
        ended.append(a)
        return step_end(ex, st, a)

    monkeypatch.setitem(handlers.HANDLERS, Op.STEP_END, relaxed_end)
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = engine.train_step(_pinned(cfg, 1), 1e-3)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ended and torch.isfinite(torch.tensor(result.loss))
    return result


@pytest.mark.parametrize("schedule", [{}, {"schedule": "zbh1", "weight_grad": "grouped"}])
def test_the_chunked_head_loss_trains_as_the_plain_one_without_synchronizing(monkeypatch,
                                                                            schedule):
    """The head's loss in chunks of 40 tokens (models/head_loss.py; a 7B run's are chunked at
    their size) in bf16 under autocast, split or not: within 1% of the plain loss's run with
    host-homed state (as the 7B runs), and a step with device-homed state waits for nothing
    on the host before its end (host-homed state reads its gradients and norms on the host by
    design: sync debug mode would stop that step at its first fold)."""
    from ratrain.models import params

    cfg = _cfg("bfloat16")
    ref = _losses(_executor(cfg, "recompute", 1, "host", **schedule), cfg, 5)
    monkeypatch.setattr(params, "HEAD_CHUNK_ELEMENTS", 40 * cfg.model.vocab_size)
    assert params.chunks(cfg.train.micro_batch_size * cfg.train.seq_len, cfg.model.vocab_size)
    got = _losses(_executor(cfg, "recompute", 1, "host", **schedule), cfg, 5)
    assert max(abs(a - b) / a for a, b in zip(ref, got)) < 0.01, (ref, got)
    engine = _executor(cfg, "recompute", 1, "device", **schedule)
    engine.train_step(_pinned(cfg, 0), 1e-3)  # first step: optimizer state, allocator warm-up
    _step_synchronized_only_at_its_end(engine, cfg, monkeypatch)
