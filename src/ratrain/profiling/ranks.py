"""What runs in `ratrain profile`'s measuring processes (measure.py starts them and turns
their results into a profile): each rank times the units through the executor's trace, a
matmul, an AdamW step and, on CUDA, host copies, every measurement started together behind a
barrier (the links' two ranks: link_rank.py). Each writes its medians as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ratrain.config import RunConfig, TrainConfig
from ratrain.host_cores import usable_cores
from ratrain.runtime.process_memory import RssGrowth
from ratrain.models.llama import alibi_bias
from ratrain.runtime.optim import make_optimizer
from ratrain.runtime.engine import PipelineEngine
from ratrain.schedule.grid import RankGrid
from ratrain.runtime.process_groups import init_groups
from ratrain.runtime.stage import DTYPES
from ratrain.schedule.plan_rules import SPLIT_SCHEDULES
from ratrain.runtime.trace import Tracer
from ratrain.training.prepare import plan_here


@dataclasses.dataclass(frozen=True)
class Counts:
    """How many times each measurement runs, and the decoder blocks of the stage the single
    process measures: `ratrain profile` takes these; a test of what the profile holds, not of
    how stable its figures are, can take fewer."""
    warmup: int = 3  # per timing; the median of 10 is stable on a noisy 2-core VM
    repeats: int = 10
    step_warmup: int = 2  # executor steps traced for the unit times
    step_repeats: int = 6
    # Small transfers on a loaded 2-core machine are bimodal (a wake-up sometimes waits out a
    # scheduler slice of a few ms): enough repeats that the median does not flip between modes.
    link_warmup: int = 2
    link_repeats: int = 15
    alone_blocks: int = 4  # (tiny: the whole model)


MATMUL_N = {"cpu": 1024, "cuda": 8192}
# AdamW's tensors: ~4M fp32 parameters are well beyond a CPU's caches. A GPU needs ~134M (2.1 GB
# with the moments) before kernel launches stop mattering: 4M ran at 1.1 TB/s on an H200, 134M at
# 3.25 TB/s, and a 4-block llama2-7b's step then came within 4% of its prediction. A GPU
# machine's host tier, updating host-homed state, gets ~67M: there 4M ran at 240 GB/s while the
# 7B run's 1.07B parameters updated at 113 GB/s (2026-11-26)
ADAMW_SHAPES = {"cpu": [(1024, 1024)] * 4, "cuda": [(4096, 4096)] * 8,
                "host": [(4096, 4096)] * 4}
LINK_SIZES = [4096 * 4**k for k in range(7)] + [32 << 20]  # 4 KiB .. 16 MiB, and 32 MiB
KINDS = ("embedding", "block", "head")  # units 0, 1, 2 with n_layers = 1


# --- timing --------------------------------------------------------------------------------------


def sync_of(device: torch.device) -> Callable[[], None]:
    """What makes a timing include the device's queued work (CUDA runs asynchronously)."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _timed(fn, sync) -> tuple[object, float]:
    sync()
    t0 = time.perf_counter()
    result = fn()
    sync()
    return result, time.perf_counter() - t0


def median_s(fn, sync, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(_timed(fn, sync)[1] for _ in range(repeats))


# --- the compute ranks ---------------------------------------------------------------------------


def compute_rank(cfg: RunConfig, counts: Counts, out_dir: str) -> None:
    """One of the concurrent measuring processes: each measurement in turn, every rank starting
    it at the same time (a gloo barrier), so each sees the others' load."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    groups = init_groups(RankGrid(world, 1)) if world > 1 else None
    if groups is None:
        dist.init_process_group("gloo")
    device = groups.device if groups else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(rank)
    sync = sync_of(device)
    # first: before other measurements leave freed memory in the allocator for it to reuse
    steps = [("units", _executor_times, (cfg, device, sync, groups, counts)),
             ("matmul_s", _matmul_times, (cfg.train.dtype, device, sync, counts)),
             ("adamw_s", _adamw_s, (cfg.train, device, sync, counts))]
    if device.type == "cuda":
        steps.append(("host_copies_s", _host_copy_times, (device, sync, counts)))
    result = {}
    for name, fn, args in steps:
        dist.barrier()
        result[name] = fn(*args)
    Path(out_dir, f"result_{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def alone_rank(cfg: RunConfig, smaller: RunConfig | None, counts: Counts, out_dir: str) -> None:
    """One process with the machine to itself: a stage of counts.alone_blocks decoder blocks
    (with the embedding and the head) through the single-process executor, keeping
    activations. Its unit times are those of a rank no other rank competes with; its memory is
    a second, larger stage for the process overhead (beside the pipeline's one-block stages).
    With `smaller` (the run on a micro-batch of fewer tokens), that run's unit times too
    (sim/shape_scale.py)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync, blocks = sync_of(device), counts.alone_blocks
    result = _traced_steps(cfg, device, sync, None, counts, "keep", blocks)
    if smaller is not None:
        fewer = _traced_steps(smaller, device, sync, None, counts, "keep", blocks)
        result["smaller"] = {kind: fewer[kind] for kind in KINDS}
    if device.type == "cpu" and usable_cores() > 1:  # fits.thread_efficiency_of
        result["block_every_core"] = _on_every_core(
            lambda: _traced_steps(cfg, device, sync, None, counts, "keep", blocks)["block"])
    split = _traced_steps(dataclasses.replace(cfg, parallel=dataclasses.replace(
        cfg.parallel, schedule="zbh1")), device, sync, None, counts, "keep", blocks)
    for kind, halves in split_halves(result, split).items():
        result[kind] += halves
    result["attention_s"] = _attention_s(cfg, device, sync, counts)
    if device.type == "cuda":
        result["host_adamw_s"] = _host_adamw_s(cfg.train, counts)
    Path(out_dir, "result_0.json").write_text(json.dumps(result))


def split_halves(whole: dict, split: dict) -> dict[str, list[float]]:
    """Per unit kind [BI, BW] from the zbh1 run, on the footing of the whole-backward run: times
    the block's forward there over its forward in the zbh1 run. The two runs are seconds apart
    and the split costs only a few % over the whole backward, while this VM's speed moves by
    more in seconds (2026-11-26: the block's (BI + BW) / B came out 1.03, 1.17 and 1.09 in
    profiles 20 minutes apart, enough to turn the predicted sign of zbh1's gain); both runs
    run the same forward, so its ratio is the drift between them."""
    drift = whole["block"][0] / split["split block forward"]
    return {kind: [t * drift for t in split[f"split {kind}"]] for kind in KINDS}


def _attention_s(cfg: RunConfig, device: torch.device, sync, counts: Counts) -> float:
    """Seconds of attention's core forward and backward on the profiled shape, as the model's
    attention runs it (causal with RoPE, an ALiBi bias otherwise): its products are one head
    wide, so it runs far below the matmul peak, and its FLOPs grow with the sequence."""
    m, t = cfg.model, cfg.train
    dtype = DTYPES[t.dtype]
    q, k, v = (torch.randn(t.micro_batch_size, m.n_heads, t.seq_len, m.head_dim, device=device,
                           dtype=dtype, requires_grad=True) for _ in range(3))
    mask = None if m.position == "rope" else alibi_bias(m.n_heads, t.seq_len, device, dtype)

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        out.backward(torch.ones_like(out))

    return median_s(step, sync, counts.warmup, counts.repeats)


def _pipeline(cfg: RunConfig, device: torch.device, groups, activation: str, tracer=None,
              blocks: int = 1):
    """The measuring ranks as a pipeline, one stage each with `blocks` decoder blocks (one
    process: the single-process executor), and its micro-batches (the same on every stage)."""
    pp = groups.grid.pp if groups else 1
    run = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, n_layers=pp * blocks),
        parallel=dataclasses.replace(cfg.parallel, pp=pp, activation=activation))
    engine = PipelineEngine(run, plan_here(run), groups, tracer, device=device)
    m, t = run.model, run.train
    shape = (t.micro_batch_size, t.seq_len)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(m.vocab_size, shape, generator=g),
                torch.randint(m.vocab_size, shape, generator=g)) for _ in range(run.n_micro)]
    return engine, batches


def _executor_times(cfg: RunConfig, device: torch.device, sync, groups, counts: Counts) -> dict:
    """Unit times as training spends them (saved-tensor hooks, ledger, the pipeline's
    communication threads included), read from the executor's own trace of a few steps of
    `_pipeline`, once keeping activations and once recomputing them (for the block's forward
    without grad); see _traced_steps."""
    out = _traced_steps(cfg, device, sync, groups, counts, "keep")
    recomputed = _traced_steps(cfg, device, sync, groups, counts, "recompute")
    out["block_forward_no_grad"] = recomputed["block_forward_no_grad"]
    return out


def _traced_steps(cfg: RunConfig, device: torch.device, sync, groups, counts: Counts,
                  activation: str, blocks: int = 1) -> dict:
    """A few traced steps of `_pipeline`: each unit kind's forward and backward (the medians of
    its actions), or with recompute the block's forward without grad. With keep also: the
    executor's own time per action (what a step took beyond its actions' durations, per
    action, plus the median of its cheapest kind of non-compute action, starting a transfer,
    say) and the memory: the ledger's growth (its peak less the masters and gradients held
    before the first step) and the process's, over all the steps (fragmentation grows)."""
    tracer = Tracer(keep_steps=counts.step_repeats)
    engine, batches = _pipeline(cfg, device, groups, activation, tracer, blocks)
    held_before, grown = engine.stage.ledger.total, _growth_since_now(device)
    walls = []
    for step in range(counts.step_warmup + counts.step_repeats):
        _, wall = _timed(lambda: engine.train_step(batches, cfg.train.lr, step), sync)
        walls.append(wall)
    durations: dict[str, list[float]] = {}
    for _, name, t0, t1 in tracer.events():
        durations.setdefault(_action_class(name, engine.cfg.model.n_layers), []).append((t1 - t0) / 1e6)
    median = {key: statistics.median(v) for key, v in durations.items()}
    if activation != "keep":
        return {"block_forward_no_grad": median["F block"]}
    if cfg.parallel.schedule in SPLIT_SCHEDULES:
        return {"split block forward": median["F block"],
                **{f"split {kind}": [median[f"BI {kind}"], median[f"BW {kind}"]] for kind in KINDS}}
    out: dict = {kind: [median[f"F {kind}"], median[f"B {kind}"]] for kind in KINDS
                 if f"F {kind}" in median}
    actions = sum(len(v) for v in durations.values()) / counts.step_repeats
    traced = sum(sum(v) for v in durations.values()) / counts.step_repeats
    cheapest = min((v for k, v in median.items() if k.startswith("op ")), default=0.0)
    step_wall = statistics.median(walls[counts.step_warmup:])
    out["overhead_s"] = max(0.0, step_wall - traced) / actions + cheapest
    out["ledger_growth"] = engine.stage.ledger.peak - held_before
    out["process_growth"] = grown()
    return out


def _action_class(name: str, n_layers: int) -> str:
    """"F block", "BI head", ... for compute actions; "op SA", "op WRG", ... for the rest."""
    op = name.rstrip("0123456789.")
    if op not in ("F", "B", "BI", "BW"):
        return "U" if op == "U" else f"op {op}"
    unit = int(name[len(op):].split(".")[0])
    kind = "embedding" if unit == 0 else "head" if unit == n_layers + 1 else "block"
    return f"{op} {kind}"


def rate_dtypes(dtype: str) -> list[str]:
    """The dtypes whose peak is measured: the compute dtype, and float32 (the simulator's
    fallback) when another is asked for."""
    return [dtype] if dtype == "float32" else [dtype, "float32"]


def _matmul_times(dtype: str, device: torch.device, sync, counts: Counts) -> dict[str, float]:
    """Seconds of an n x n matmul in each of _rate_dtypes, laid out as a Linear's forward
    (x @ W.T): on a CPU without native bf16/fp16, torch's fallback gemm runs a @ b about 8x
    slower than a @ b.T, which would make a 'peak' far below what the model's layers get."""
    n = MATMUL_N[device.type]
    out = {}
    for name in rate_dtypes(dtype):
        a, b = (torch.randn(n, n, device=device, dtype=DTYPES[name]) for _ in range(2))
        out[name] = median_s(lambda: a @ b.T, sync, counts.warmup, counts.repeats)
    return out


def _adamw_s(train: TrainConfig, device: torch.device, sync, counts: Counts,
             tier: str | None = None) -> float:
    """One fused AdamW step (ratrain's settings) over ADAMW_SHAPES of the device's type (or of
    `tier`), gradients in place; the host tier's tensors pinned, as host-homed state is."""
    pinned = tier == "host"
    params = [torch.nn.Parameter(torch.randn(shape).pin_memory() if pinned
                                 else torch.randn(shape, device=device))
              for shape in ADAMW_SHAPES[tier or device.type]]
    for p in params:
        p.grad = torch.randn_like(p)
    return median_s(make_optimizer(params, train).step, sync, counts.warmup, counts.repeats)


def _host_adamw_s(train: TrainConfig, counts: Counts) -> float:
    """A GPU machine's host tier: the AdamW step over pinned host tensors with every core, as
    a single training process runs it (a rank of several has --threads)."""
    return _on_every_core(lambda: _adamw_s(train, torch.device("cpu"), lambda: None, counts,
                                           tier="host"))


def _on_every_core(fn):
    """fn() with this process computing on every core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def _growth_since_now(device: torch.device) -> Callable[[], int]:
    """How much the process has grown since this call, when asked: CPU, its peak RSS over its
    size now (as metrics.jsonl reports it); CUDA, peak allocated over allocated now."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        return lambda: torch.cuda.max_memory_allocated(device) - start
    rss = RssGrowth()
    rss.start()
    return lambda: rss.peak() or 0


def _host_copy_times(device: torch.device, sync, counts: Counts) -> dict[str, list[float]]:
    """Pinned host <-> device copies of each of LINK_SIZES (CUDA only)."""
    out = {"host_to_device": [], "device_to_host": []}
    for size in LINK_SIZES:
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        out["host_to_device"].append(median_s(lambda: dev.copy_(host, non_blocking=True), sync,
                                              counts.link_warmup, counts.link_repeats))
        out["device_to_host"].append(median_s(lambda: host.copy_(dev, non_blocking=True), sync,
                                              counts.link_warmup, counts.link_repeats))
    return out
