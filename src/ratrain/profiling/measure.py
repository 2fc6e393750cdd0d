"""`ratrain profile`: measure the machine this runs on and write a `HardwareProfile`
(sim/profile.py) that the simulator takes as is. This module starts the measuring processes
(their code: ranks.py, link_rank.py) and assembles the profile from the figures fitted to
their results (fits.py).

The whole measurement runs `repeats` times; the profile holds each figure's median and names in
its notes the figures that did not repeat (sim/profile_repeats.py). Each time, everything is
measured under the load of ranks that share the machine: `ranks` local processes of one
thread each (launch_local; training gives them the cores split among them, which the simulator
prices through the measured thread efficiency), started together behind a barrier before each measurement, each
taking the median of its repeats after warm-ups; the profile holds the median over the ranks.

* Unit times: ratrain's single-process executor runs a few steps of the plan `ratrain train`
  would run, with its tracer on; each unit kind's forward and backward are the medians of its
  traced actions (saved-tensor hooks and ledger included). Once in one process alone (a stage
  of Counts.alone_blocks blocks): the profile's unit times. Once in every measuring rank
  together, the model cut to one decoder block per rank: how much slower a unit runs when all
  ranks compute (`contention`), the block's forward without grad (from a recompute plan), and
  what a step took beyond its actions' durations, per action: the executor's own overhead.
* Process overhead: what the process grew by (peak RSS over its size before the first step; on
  CUDA peak allocated) beyond the executor's ledger, over a few steps, on the two stages (one
  block, Counts.alone_blocks blocks): a fixed part and a part per byte of the ledger's growth.
* Compute rate: a square matmul gives the peak; attention's core (scaled_dot_product_attention
  forward and backward on the profiled shape) timed alone gives its own efficiency, and the
  rest of the block's FLOPs (sim/unit_costs.py) over the rest of its measured forward +
  backward the efficiency of everything else. Priced at one rate, a 512-token sequence was
  under-predicted by 17% (attention runs at a quarter of the block's rate on our CPU and its
  FLOPs grow with the sequence).
* Memory bandwidth: a fused AdamW step, charged 28 bytes per parameter as the cost model does.
* Links: always between 2 local ranks (gloo over loopback, NCCL with >= 2 GPUs), fitted to
  latency + bytes / bandwidth. They are local figures: inter_node is a copy, to be replaced.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from ratrain.byte_units import decimal_bytes
from ratrain.config import ParallelConfig, RunConfig, TrainConfig
from ratrain.counts import counted
from ratrain.errors import UserError
from ratrain.host_cores import usable_cores
from ratrain.models.presets import get_preset
from ratrain.profiling.fits import (adamw_params, compute_rates, contention_of,
                                    fit_process_overhead, host_tier, links_of, measured_shape,
                                    median_over_ranks, memory_bandwidth, smaller_shape,
                                    thread_efficiency_of)
from ratrain.profiling.link_rank import link_backend, link_rank
from ratrain.profiling.ranks import LINK_SIZES, MATMUL_N, Counts, alone_rank, compute_rank
from ratrain.runtime.launch import launch_local
from ratrain.sim.cost_model import UPDATE_BYTES_PER_PARAM
from ratrain.sim.profile import Device, HardwareProfile
from ratrain.sim.profile_repeats import combine
from ratrain.sim.unit_costs import UnitShape
from ratrain.sim.working_bytes import working_bytes
from ratrain.profiling.other_work import OtherWork

REPEATS = 3  # whole measurements, so that one disturbed by other work is outvoted
N_MICRO = 4  # micro-batches of the traced executor steps
MIN_SMALLER_TOKENS = 16  # the second shape's least tokens a micro-batch
INTER_NODE_NOTE = "not measured: the local loopback figures; set them for your network"


# --- the request ---------------------------------------------------------------------------------


def profile_config(model: str, seq_len: int, micro_batch_size: int, dtype: str) -> RunConfig:
    """The run whose units are measured: the preset cut to one decoder block (a unit's time does
    not depend on how many others there are), N_MICRO micro-batches per step. Validating it
    turns an unknown preset, a bad dtype or a too long sequence into a UserError."""
    _require_positive("--seq-len", seq_len)
    _require_positive("--micro-batch-size", micro_batch_size)
    m = dataclasses.replace(get_preset(model), n_layers=1)
    cfg = RunConfig(model=m, train=TrainConfig(seq_len=seq_len, micro_batch_size=micro_batch_size,
                                               global_batch=N_MICRO * micro_batch_size,
                                               dtype=dtype),
                    parallel=ParallelConfig(schedule="1f1b"))  # measured as trained; BI/BW apart
    cfg.validate()
    return cfg


def smaller_config(cfg: RunConfig) -> RunConfig | None:
    """The profiled run on about a quarter of its tokens a micro-batch (fewer sequences, else
    shorter ones), whose unit times say how the rate falls with the tokens
    (sim/shape_scale.py); None where that would be under MIN_SMALLER_TOKENS."""
    t = cfg.train
    batch = max(1, t.micro_batch_size // 4)
    seq = t.seq_len * t.micro_batch_size // (4 * batch)
    if batch * seq < MIN_SMALLER_TOKENS:
        return None
    return dataclasses.replace(cfg, train=dataclasses.replace(
        t, seq_len=seq, micro_batch_size=batch, global_batch=N_MICRO * batch))


def _require_positive(flag: str, value: int) -> None:
    if value < 1:
        raise UserError(f"{flag} must be >= 1, got {value}")


def default_ranks(on_cuda: bool) -> int:
    """On a CPU 2 ranks (the load of a 2-stage run), at most one per core; on a GPU 1."""
    return 1 if on_cuda else min(2, usable_cores())


def default_out() -> Path:
    return Path(f"profile-{platform.node()}.yaml")


# --- entry point ---------------------------------------------------------------------------------


def measure(model: str = "tiny", seq_len: int = 256, micro_batch_size: int = 2,
            dtype: str = "float32", ranks: int | None = None, repeats: int = REPEATS,
            progress: Callable[[str], None] = lambda line: None,
            counts: Counts = Counts()) -> HardwareProfile:
    """Measure this machine `repeats` times (about 15 s each for the defaults on 2 CPU cores)
    and combine them (sim/profile_repeats.py): every figure's median, and in the notes the
    figures that did not repeat. `counts`: how often each measurement runs within a repeat."""
    cfg = profile_config(model, seq_len, micro_batch_size, dtype)
    smaller = smaller_config(cfg)
    on_cuda = torch.cuda.is_available()
    ranks = default_ranks(on_cuda) if ranks is None else ranks
    _require_positive("--ranks", ranks)
    if ranks > N_MICRO:  # a stage a rank, over the traced steps' N_MICRO micro-batches
        raise UserError(f"--ranks {ranks}: at most {N_MICRO} (the ranks measure as a pipeline "
                        f"of one stage each, over {N_MICRO} micro-batches)")
    _require_positive("--repeats", repeats)
    measured, busy = [], []
    for i in range(repeats):
        progress(f"measuring {i + 1}/{repeats}")
        with tempfile.TemporaryDirectory(prefix="ratrain-profile-") as tmp:
            with OtherWork() as compute_load:
                per_rank = _launch(ranks, compute_rank, (cfg, counts), Path(tmp, "compute"))
            with OtherWork() as alone_load:
                alone = _launch(1, alone_rank, (cfg, smaller, counts), Path(tmp, "alone"))[0]
            links = _launch(2, link_rank, (counts,), Path(tmp, "links"))[0]
        measured.append(_build_profile(cfg, smaller, model, ranks, on_cuda, per_rank, links,
                                       alone, counts))
        busy.append(max(compute_load.cores, alone_load.cores))
    return combine(measured, LINK_SIZES, other_work=busy)


def _launch(world: int, fn, args: tuple, out_dir: Path) -> list[dict]:
    """Run fn(*args, out_dir) in `world` processes of 1 thread; the results they wrote."""
    out_dir.mkdir(parents=True)
    launch_local(world, fn, (*args, str(out_dir)), out_dir / "errors", threads=1)
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("result_*.json"))]


# --- the profile ---------------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _build_profile(cfg: RunConfig, smaller: RunConfig | None, model: str, ranks: int,
                   on_cuda: bool, per_rank: list[dict], links: dict, alone: dict,
                   counts: Counts) -> HardwareProfile:
    device_type = "cuda" if on_cuda else "cpu"
    # GPU ranks have a device each: what they share is not the compute's.
    contention = 0.0 if on_cuda or ranks < 2 else contention_of(per_rank, alone)
    notes = _notes(cfg, ranks, device_type, counts)
    measured = measured_shape(cfg, model, per_rank, alone, contention, notes)
    fewer = [] if smaller is None else [smaller_shape(smaller, model, alone["smaller"])]
    compute = compute_rates(cfg, device_type, per_rank, measured.block, alone["attention_s"])
    bandwidth = memory_bandwidth(per_rank, device_type)
    overhead = median_over_ranks(per_rank, lambda r: r["units"]["overhead_s"])
    # what a block's backward makes while it runs is the simulator's own (sim/working_bytes.py),
    # not the process's: every profiled stage runs one
    working = working_bytes(UnitShape(cfg.model, cfg.train.micro_batch_size, cfg.train.seq_len,
                                      cfg.train.dtype), "block", "backward")
    pipeline_stage = (median_over_ranks(per_rank, lambda r: r["units"]["ledger_growth"]),
                      median_over_ranks(per_rank, lambda r: r["units"]["process_growth"]
                                         - r["units"]["ledger_growth"]) - working)
    fixed, per_byte = fit_process_overhead(
        [pipeline_stage, (alone["ledger_growth"],
                          alone["process_growth"] - alone["ledger_growth"] - working)])
    intra = links_of(links)
    tier = host_tier(per_rank, alone, notes) if on_cuda else {}
    node_memory = None
    if on_cuda:
        memory = torch.cuda.get_device_properties(0).total_memory
        name, cores, per_node = torch.cuda.get_device_name(0), None, torch.cuda.device_count()
    else:
        memory, node_memory = _ram_bytes() / ranks, float(_ram_bytes())
        notes["device.memory_bytes"] = (f"the machine's RAM ({decimal_bytes(_ram_bytes())}) / "
                                        f"{ranks} rank{'s' if ranks != 1 else ''}")
        # a search or simulation of other rank counts splits the RAM, not this rank's share
        notes["device.node_memory_bytes"] = (
            "the machine's RAM, which its ranks share: a search or simulation of N ranks holds "
            "each to it / min(N, devices_per_node), or device.memory_bytes where less")
        name, cores, per_node = _cpu_name(), usable_cores(), 64
        notes["devices_per_node"] = "all local ranks are one node: loopback"
    if cores:
        notes["device.thread_efficiency"] = (
            "the process alone: its block's forward and backward on one thread and on every "
            "core; what each thread beyond the first added, as a fraction of one thread's speed")
    device = Device(name=name, memory_bytes=float(memory), compute=compute,
                    memory_bandwidth=bandwidth, cores=cores, node_memory_bytes=node_memory, **tier,
                    action_overhead_s=overhead, process_overhead_bytes=fixed,
                    process_overhead_per_byte=per_byte, contention=contention,
                    thread_efficiency=thread_efficiency_of(alone, cores or 1))
    return HardwareProfile(
        name=f"measured-{platform.node()}", description=_description(cfg, model, ranks, name),
        device=device, devices_per_node=per_node, intra_node=intra,
        inter_node=copy.deepcopy(intra), measured=[measured, *fewer], notes=notes)


def _description(cfg: RunConfig, model: str, ranks: int, device_name: str) -> str:
    t = cfg.train
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Measured by `ratrain profile` on {platform.node()} ({device_name}), {when}, torch "
            f"{torch.__version__}: {model} units, micro-batch {t.micro_batch_size} x {t.seq_len} "
            f"tokens, {t.dtype}, {counted(ranks, 'concurrent rank')} of 1 thread.")


def _second_entry(cfg: RunConfig) -> str:
    """What `measured` holds beside the profiled shape (smaller_config)."""
    if smaller_config(cfg) is not None:
        return ("A second entry: the same process's forwards and backwards on a micro-batch of "
                "about a quarter of the tokens (sim/shape_scale.py).")
    tokens = cfg.train.seq_len * cfg.train.micro_batch_size
    return (f"No second entry: a quarter of the micro-batch's {counted(tokens, 'token')} is under "
            f"the {MIN_SMALLER_TOKENS} a second shape needs, so other micro-batch shapes are "
            f"priced at this one's rates (sim/shape_scale.py); profile a larger micro-batch "
            f"for one.")


def _notes(cfg: RunConfig, ranks: int, device_type: str,
           counts: Counts = Counts()) -> dict[str, str]:
    dtype, blocks = cfg.train.dtype, counts.alone_blocks
    n = MATMUL_N[device_type]
    params = adamw_params(device_type)
    link_how = {"nccl": "NCCL between 2 GPUs",
                "gloo": ("gloo over loopback between 2 local processes" if device_type == "cpu"
                         else "gloo on host tensors between 2 local processes (one GPU: no "
                              "NCCL peer)")}
    notes = {
        "measured": (f"unit times read from the executor's trace of {counts.step_repeats} steps "
                     f"(after {counts.step_warmup}) of one process alone with {blocks} decoder "
                     f"blocks, "
                     f"{N_MICRO} micro-batches; per kind the median of its actions; the halves "
                     f"of a split backward (BI, BW) from the same under the zbh1 schedule, "
                     f"scaled by the block's forward in the first run over its forward in the "
                     f"zbh1 run (the machine's drift between the two). {_second_entry(cfg)} "
                     f"The block's forward "
                     f"without grad: from a pipeline of the {counted(ranks, 'measuring rank')} "
                     f"(one block each, recomputing), divided by 1 + device.contention"),
        "device.contention": (f"the same traced steps of a pipeline of the "
                              f"{counted(ranks, 'measuring rank')}, one stage each with one "
                              f"decoder block, all computing at "
                              f"once: the median over the unit kinds' forwards and backwards of "
                              f"their time there over their time alone, less 1 (0 on GPUs: each "
                              f"rank has its own)"),
        f"device.compute.{dtype}": (f"peak: a {n}x{n} matmul a @ b.T in {dtype} (2N^3 FLOPs); "
                                    f"attention_efficiency: attention's core (causal "
                                    f"scaled_dot_product_attention, forward and backward) on "
                                    f"the profiled shape, its FLOPs per second alone over the "
                                    f"peak; efficiency: the block's other forward + backward "
                                    f"FLOPs (sim/unit_costs.py) per second of the rest of its "
                                    f"measured time, over the peak"),
        "device.memory_bandwidth": (f"a fused AdamW step over {params / 1e6:.1f}M fp32 parameters, "
                                    f"charged {UPDATE_BYTES_PER_PARAM} bytes per parameter"),

        "device.action_overhead_s": ("the same traced steps: the step's wall time beyond its "
                                     "actions' durations, per action, plus the median of the "
                                     "cheapest kind of non-compute action"),
        "device.process_overhead_bytes": (f"two stages, {counts.step_warmup + counts.step_repeats} "
                                          f"keep steps each: the pipeline's one-block stages "
                                          f"(median over ranks) and the single process's "
                                          f"{blocks}-block "
                                          f"one: the peak RSS growth over the size before the "
                                          f"first step (CUDA: peak allocated) minus the ledger's "
                                          f"growth and a block's backward's working bytes "
                                          f"(sim/working_bytes.py), against the ledger's "
                                          f"growth; the line "
                                          f"through the two gives the fixed part and "
                                          f"device.process_overhead_per_byte"),
        "intra_node": (f"{link_how[link_backend()]}: point to point (half an isend/irecv "
                       f"ping-pong) and all_reduce, {LINK_SIZES[0] // 1024} KiB to "
                       f"{LINK_SIZES[-1] >> 20} MiB, fitted to latency + bytes / bandwidth (the "
                       f"all_reduce as a ring of 2: bytes / bandwidth + 2 x latency)"),
        "inter_node": INTER_NODE_NOTE,
    }
    if dtype != "float32":
        notes["device.compute.float32"] = (f"peak: the {n}x{n} matmul in float32; efficiencies: "
                                           "not measured (ratrain profile --dtype float32)")
    return notes

