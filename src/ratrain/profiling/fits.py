"""The figures of a profile, fitted from what the measuring ranks wrote (profiling/ranks.py's
results, per rank, and the single process's `alone`): link latency and bandwidth, contention,
the process overhead's two parts, compute rates, memory bandwidths and a GPU's host tier.
measure.py runs the measurement and assembles the profile from these."""

from __future__ import annotations

import statistics

import torch

from ratrain.byte_units import decimal_bytes
from ratrain.config import RunConfig
from ratrain.counts import counted
from ratrain.host_memory import available_host_bytes
from ratrain.profiling.ranks import ADAMW_SHAPES, KINDS, LINK_SIZES, MATMUL_N, rate_dtypes
from ratrain.sim.cost_model import UPDATE_BYTES_PER_PARAM
from ratrain.sim.profile import ComputeRate, Link, LinkClass, MeasuredShape, ModelShape, UnitTimes
from ratrain.sim.unit_costs import UnitShape, attention_flops, backward_flops, forward_flops


def fit_link(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """(latency, bandwidth) of time = latency + bytes / bandwidth, by least squares on relative
    residuals: timing noise grows with the time, and unweighted residuals of the largest sizes
    would swamp the microseconds of latency the small ones show. A negative intercept (noise)
    is clamped to 0."""
    w = [1 / t**2 for t in times]
    s = sum(w)
    sx = sum(wi * x for wi, x in zip(w, sizes))
    sy = sum(wi * t for wi, t in zip(w, times))
    sxx = sum(wi * x * x for wi, x in zip(w, sizes))
    sxy = sum(wi * x * t for wi, x, t in zip(w, sizes, times))
    slope = (s * sxy - sx * sy) / (s * sxx - sx * sx)
    if slope <= 0:
        raise RuntimeError(f"link times do not grow with the size: {dict(zip(sizes, times))}")
    return max(0.0, (sy - slope * sx) / s), 1 / slope


def median_over_ranks(per_rank: list[dict], get) -> float:
    return statistics.median(get(r) for r in per_rank)


NO_GRAD = "measured[0].block_forward_no_grad_s"


def measured_shape(cfg: RunConfig, model: str, per_rank: list[dict], alone: dict,
                   contention: float, notes: dict[str, str]) -> MeasuredShape:
    """The units' times with the machine to themselves (the single process's); the block's
    forward without grad, measured in the pipeline, taken back to the same footing: at most
    the block's forward with grad (what went past it is said in `notes`)."""
    t = cfg.train
    times = {kind: UnitTimes(*alone[kind]) for kind in KINDS}
    no_grad = median_over_ranks(per_rank, lambda r: r["units"]["block_forward_no_grad"]) \
        / (1 + contention)
    with_grad = times["block"].forward_s
    # contention is a median over every unit kind and never below 0, so a pipeline slowed more
    # than that leaves its no-grad forward above the one with autograd, which does more work
    # (2026-12-02: 19.9 ms against 11.5 ms, and recomputation priced at it)
    if no_grad > with_grad:
        notes[NO_GRAD] = (f"the pipeline's {no_grad * 1e3:.3g} ms, on the footing of the "
                          f"machine alone, is above the block's forward with autograd "
                          f"({with_grad * 1e3:.3g} ms), which does more: bounded at that")
        no_grad = with_grad
    return MeasuredShape(model=model, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size,
                         dtype=t.dtype, **times, block_forward_no_grad_s=no_grad,
                         model_shape=ModelShape.of(cfg.model))


def smaller_shape(smaller: RunConfig, model: str, times: dict) -> MeasuredShape:
    """The units' times alone on the smaller micro-batch (measure.smaller_config): forward and
    backward only (its split halves and forward without grad are priced from them)."""
    t = smaller.train
    return MeasuredShape(model=model, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size,
                         dtype=t.dtype, **{kind: UnitTimes(*times[kind]) for kind in KINDS},
                         model_shape=ModelShape.of(smaller.model))


def contention_of(per_rank: list[dict], alone: dict) -> float:
    """How much slower a unit runs while every measuring rank computes (the pipeline's ranks
    share the machine's cores, caches and memory bandwidth) than alone: the median over the
    unit kinds' forwards and backwards of pipeline / alone, less 1 (never below 0)."""
    ratios = [median_over_ranks([r for r in per_rank if kind in r["units"]],
                                 lambda r: r["units"][kind][i]) / alone[kind][i]
              for kind in KINDS for i in (0, 1)]
    return max(0.0, statistics.median(ratios) - 1.0)


def fit_process_overhead(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(fixed bytes, bytes per byte of ledger growth) of the process's memory beyond the
    ledger, through the two measured stages (ledger growth, process growth beyond it): the
    line through them where the larger stage grew more beyond its ledger, else the larger of
    the two as a fixed part; neither part negative."""
    (g1, o1), (g2, o2) = sorted(points)
    if not (g2 > g1 and o2 > o1):
        return max(0.0, o1, o2), 0.0
    per_byte = (o2 - o1) / (g2 - g1)
    return max(0.0, o1 - per_byte * g1), per_byte


def compute_rates(cfg: RunConfig, device_type: str, per_rank: list[dict],
                   block: UnitTimes, attention_s: float) -> dict[str, ComputeRate]:
    """Peak from the matmul; attention's efficiency from its core timed alone, the efficiency
    from the rest of the block's FLOPs over the rest of its measured time. float32's
    efficiencies, where only its matmul was measured, are None: not measured. (They were the
    compute dtype's until 2026-12-02: a bf16 profile of the 2-core VM then priced float32 at
    bf16's 0.18, and a float32 step 4x slow.)"""
    dtype = cfg.train.dtype
    shape = UnitShape(cfg.model, cfg.train.micro_batch_size, cfg.train.seq_len, dtype)
    flops = forward_flops(shape, "block") + backward_flops(shape, "block")
    attention = 3 * attention_flops(shape, "block")
    block_s = block.forward_s + block.backward_s
    n = MATMUL_N[device_type]
    peaks = {name: 2 * n**3 / median_over_ranks(per_rank, lambda r: r["matmul_s"][name])
             for name in rate_dtypes(dtype)}
    if not 0 < attention_s < block_s / 2:  # not what a block's attention costs: price it whole
        efficiency, attention_efficiency = flops / block_s / peaks[dtype], None
    else:
        efficiency = (flops - attention) / (block_s - attention_s) / peaks[dtype]
        attention_efficiency = attention / attention_s / peaks[dtype]
    return {name: ComputeRate(peak, efficiency, attention_efficiency) if name == dtype
            else ComputeRate(peak, None) for name, peak in peaks.items()}


def adamw_params(device_type: str) -> int:
    return sum(a * b for a, b in ADAMW_SHAPES[device_type])


def memory_bandwidth(per_rank: list[dict], device_type: str) -> float:
    return (UPDATE_BYTES_PER_PARAM * adamw_params(device_type)
            / median_over_ranks(per_rank, lambda r: r["adamw_s"]))


def host_link_of(per_rank: list[dict]) -> tuple[Link, str]:
    """The slower direction of pinned copies (offload and reload both cross it)."""
    fits = {}
    for direction in ("host_to_device", "device_to_host"):
        times = [median_over_ranks(per_rank, lambda r: r["host_copies_s"][direction][i])
                 for i in range(len(LINK_SIZES))]
        fits[direction] = fit_link(LINK_SIZES, times)
    note = "; ".join(f"{d}: {bw / 1e9:.3g} GB/s + {lat * 1e6:.3g} us"
                     for d, (lat, bw) in fits.items())
    latency, bandwidth = min(fits.values(), key=lambda f: f[1])
    return Link(bandwidth, latency), f"pinned copies, the slower direction ({note})"


def host_tier(per_rank: list[dict], alone: dict, notes: dict[str, str]) -> dict:
    """A GPU's host tier, as Device fields: the link to it, the bandwidth host-homed state is
    updated at, and no collectives there (NCCL reduces device memory only, so host-homed
    gradients are summed on the GPUs before they fold: PipelinePlan.device_grad_sum; the GPU
    presets say so too). The host's memory and bandwidth are split over the node's GPUs, as
    the presets' are: their ranks hold their state there and update it at once."""
    link, notes["device.host_link"] = host_link_of(per_rank)
    gpus = max(1, torch.cuda.device_count())
    notes["device.host_memory_bandwidth"] = (
        f"the same AdamW step over {adamw_params('host') / 1e6:.1f}M pinned host parameters "
        f"with every core, as one training process has them, / {counted(gpus, 'GPU')} of the "
        f"node: what host-homed state's update, norm and gradient folds run at")
    fields = {"host_link": link, "host_collectives": False,
              "host_memory_bandwidth": (UPDATE_BYTES_PER_PARAM * adamw_params("host")
                                        / alone["host_adamw_s"] / gpus)}
    available = available_host_bytes()
    if available is not None:  # what the planner bounds host-homed state by (None: unbounded)
        fields["host_memory_bytes"] = float(available / gpus)
        notes["device.host_memory_bytes"] = (
            f"the host memory available when profiled ({decimal_bytes(available)}: MemAvailable, "
            f"or a memory cgroup's room) / {counted(gpus, 'GPU')} of the node")
    return fields


def links_of(links: dict) -> LinkClass:
    """p2p: latency + bytes/bw. all_reduce over n = 2 ranks in a ring: 2(n-1)/n x bytes/bw +
    2(n-1) x latency = bytes/bw + 2 x latency."""
    p2p_latency, p2p_bw = fit_link(LINK_SIZES, links["p2p_s"])
    ar_intercept, ar_bw = fit_link(LINK_SIZES, links["all_reduce_s"])
    return LinkClass(p2p=Link(p2p_bw, p2p_latency), collective=Link(ar_bw, ar_intercept / 2))


def thread_efficiency_of(alone: dict, cores: int) -> float | None:
    """Device.thread_efficiency from the process alone: its block's forward and backward on
    one thread (`block`) and on every core (`block_every_core`); what each thread beyond the
    first added, as a fraction of one thread's speed, within [0, 1]. None where it was not
    measured (one core, a GPU)."""
    if "block_every_core" not in alone or cores < 2:
        return None
    one, every = sum(alone["block"][:2]), sum(alone["block_every_core"][:2])
    return min(1.0, max(0.0, (one / every - 1.0) / (cores - 1)))
