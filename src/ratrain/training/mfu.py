"""Model FLOPs utilization: the model's FLOPs per token over what the devices could do at peak.

FLOPs per token follow the convention of PaLM (appendix B) and torchtitan: 6 N for the forward
and backward of the weight matrix products, plus 12 L H Q T for attention's two products
(scores and weighted values), with N the parameters that take part in a matrix product per
token (all but the input embedding table, a lookup; the output head counts, tied or not), L
the layers, H the heads, Q the head dimension and T the sequence length. Attention is counted
whole although causal attention needs half of it, as both references count it; recomputation
is not counted (it is hardware FLOPs, not model FLOPs). The simulator's cost model
(sim/unit_costs.py) counts what is computed instead, so the two are not meant to agree.

The peak, per device, times the devices of the run:

* a GPU: its datasheet's dense peak for the compute dtype (DATASHEET_TFLOPS, by device name);
  unknown GPUs fall back to a given hardware profile's peak, else there is no MFU;
* a CPU: the matmul peak of one core, times the cores the run uses: a given hardware profile's
  (`ratrain profile` measures it), else measured once at the start of the run by the same
  matmul `ratrain profile` times (1024 x 1024, laid out as a Linear's forward, one thread). It
  is measured rather than taken from the cpu-local preset because machines of one kind differ
  by up to 2x (docs/machines.md) and a fixed figure would put the difference into the MFU; the
  fastest of several repeats is taken, since load from other processes only ever slows a
  repeat down. Each repeat counts the process's CPU time where that is less than the wall
  time (a repeat the scheduler set aside for another process), and the repeats go on for
  CPU_PEAK_BUDGET_S: on a shared 2-core machine six repeats in 0.2 s could all fall in a busy
  spell and come out up to 2x low, which made a run's MFU 116%. A resume on the same machine
  reuses the measurement its checkpoint kept (Peak.measured): measured again, the figure moved
  by 30% between two starts on one machine, and the MFU of the run's rows with it.

No run does more than its peak: an MFU above 100% says the peak is low (measured while the
machine was busy, or a profile's from another machine), and the summary line and the report
say so (mfu_in_words) instead of showing it as a figure. Where the profile says its figures
were measured beside other work (sim/profile_repeats.py's note), that is the cause they
name, not the peak the user gave.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

from ratrain.config import ModelConfig
from ratrain.host_cores import usable_cores

# Dense (no sparsity) peak TFLOP/s by compute dtype, from the vendors' datasheets. float32 is
# the non-tensor-core figure: PyTorch does not use TF32 for float32 matmuls by default.
DATASHEET_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},  # the H100 SXM's compute
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
}

CPU_MATMUL_N = 1024  # as `ratrain profile` (profiling/ranks.MATMUL_N["cpu"])
CPU_MATMUL_N_SLOW = 512  # bfloat16/float16 on a CPU without native support: about 15x slower
CPU_MATMUL_REPEATS = 6  # at least; more while CPU_PEAK_BUDGET_S lasts
CPU_PEAK_BUDGET_S = 0.5  # of wall time, the warm-up's included
BESIDE_OTHER_WORK = "measured beside other work"  # in a profile peak's source: peak_low reads it


def matmul_params(model: ModelConfig) -> int:
    """Parameters taking part in a matrix product per token: every decoder block's (norms
    included, as torchtitan counts them), the final norm and the output head."""
    from ratrain.models.params import count_params

    embedding = 0 if model.tie_embeddings else model.vocab_size * model.dim
    return count_params(model) - embedding


def flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward and backward): 6 N + 12 L H Q T."""
    attention = 12 * model.n_layers * model.n_heads * model.head_dim * seq_len
    return 6.0 * matmul_params(model) + attention


@dataclass
class Peak:
    """The devices' peak FLOP/s for the run (None: unknown) and where the figure comes from;
    `measured`: a CPU's measured one-core peak and the machine it is of (cpu_machine), for a
    resume of the run to reuse."""

    flops: float | None
    source: str
    measured: dict | None = None


def gpu_datasheet_key(device_name: str) -> str | None:
    """The DATASHEET_TFLOPS entry of a CUDA device name ('NVIDIA H100 80GB HBM3': H100 SXM)."""
    name = device_name.upper()
    if "H200" in name:
        return "H200"
    if "H100" in name:
        return "H100 PCIe" if "PCIE" in name else "H100 SXM"
    if "A100" in name:
        return "A100"
    return None


def gpu_peak(device_name: str, dtype: str, devices: int) -> Peak:
    key = gpu_datasheet_key(device_name)
    if key is None or dtype not in DATASHEET_TFLOPS[key]:
        return Peak(None, f"no datasheet peak for {device_name!r} ({dtype}); "
                          "pass --profile with its peak for MFU")
    tflops = DATASHEET_TFLOPS[key][dtype]
    return Peak(tflops * 1e12 * devices,
                f"datasheet: {key} {dtype} dense {tflops:g} TFLOP/s {_times(devices, 'GPU')}")


def cpu_machine(dtype: str) -> dict:
    """What a measured one-core peak is of. Not the ranks' threads: the figure is one core's,
    measured on one thread whatever they are, and the cores it is multiplied by are counted
    again at each start."""
    return {"host": platform.node(), "cores": usable_cores(), "dtype": dtype}


def cpu_cores_used(world: int, threads_per_rank: int) -> int:
    """Cores a run's ranks compute on: its threads, at most the cores of each node."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // max(1, local))
    return min(usable_cores(), local * threads_per_rank) * nodes


def measure_cpu_core_peak(dtype: str = "float32") -> float:
    """FLOP/s of the fastest n x n matmul (x @ W.T) on one thread among CPU_MATMUL_REPEATS
    or more (fastest_seconds): about 0.5 s."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = CPU_MATMUL_N if dtype == "float32" else CPU_MATMUL_N_SLOW
        a, b = (torch.randn(n, n, dtype=getattr(torch, dtype)) for _ in range(2))
        best = fastest_seconds(lambda: a @ b.T)
    finally:
        torch.set_num_threads(threads)
    return 2.0 * n**3 / best


def fastest_seconds(work: Callable[[], object], clocks=(time.perf_counter, time.process_time),
                    repeats: int = CPU_MATMUL_REPEATS,
                    budget_s: float = CPU_PEAK_BUDGET_S) -> float:
    """The least time `work` took, over `repeats` runs and as many more as fit in `budget_s`
    (by the first clock, counted from before a warm-up run). Each run's time is the least of
    what the `clocks` (wall, the process's CPU time) saw pass: a run descheduled for another
    process took its CPU time, not its wall time; the process's, not the thread's, so that
    work a library hands to a thread of its own is counted."""
    wall = clocks[0]
    start = wall()
    work()  # warm-up
    best = float("inf")
    done = 0
    while done < repeats or wall() - start < budget_s:
        before = [clock() for clock in clocks]
        work()
        best = min(best, *(clock() - t0 for clock, t0 in zip(clocks, before)))
        done += 1
    return best


def run_peak(device_type: str, dtype: str, world: int, threads_per_rank: int,
             profile=None, device_name: str | None = None,
             measured_before: dict | None = None) -> Peak:
    """The peak of a run's devices (see the module's note); `profile`: a HardwareProfile or
    None; `measured_before`: the Peak.measured of the run's earlier part (None: a new run)."""
    rate = profile.device.compute.get(dtype) if profile is not None else None
    if device_type == "cuda":
        peak = gpu_peak(device_name or "", dtype, world)
        if peak.flops is None and rate is not None:
            return Peak(rate.peak_flops * world, f"{_profile_source(profile)}: {dtype} "
                        f"{rate.peak_flops / 1e12:.4g} TFLOP/s {_times(world, 'GPU')}")
        return peak
    cores = cpu_cores_used(world, threads_per_rank)
    times = _times(cores, "core")
    if rate is not None:
        return Peak(rate.peak_flops * cores, f"{_profile_source(profile)}: {dtype} "
                    f"{rate.peak_flops / 1e9:.4g} GFLOP/s per core {times}")
    machine = cpu_machine(dtype)
    reused = measured_before is not None and measured_before.get("machine") == machine
    per_core = measured_before["flops_per_core"] if reused else measure_cpu_core_peak(dtype)
    n = CPU_MATMUL_N if dtype == "float32" else CPU_MATMUL_N_SLOW
    return Peak(per_core * cores, f"measured{' at an earlier start of the run' if reused else ''}: "
                f"{n}x{n} {dtype} matmul on 1 thread, {per_core / 1e9:.4g} GFLOP/s per core "
                f"{times}", {"machine": machine, "flops_per_core": per_core})


def _times(n: int, what: str) -> str:
    return f"x {n} {what}{'' if n == 1 else 's'}"


def _profile_source(profile) -> str:
    """Where a profile's peak comes from. One whose every repeat was measured beside other work
    (sim/profile_repeats.combine's note; busy repeats set aside beside quiet ones leave a quiet
    profile) says so: that work's load, not the profile, is then why its peak is low."""
    from ratrain.sim.profile_repeats import LOADED

    beside = f" ({BESIDE_OTHER_WORK})" if LOADED in profile.notes.get("other_work", "") else ""
    return f"profile {profile.name}{beside}"


def mfu(flops_per_tok: float, tokens_per_s: float, peak_flops: float | None) -> float | None:
    """Achieved model FLOP/s over the peak (a fraction), or None without a peak."""
    if not peak_flops or tokens_per_s is None:
        return None
    return flops_per_tok * tokens_per_s / peak_flops


def mfu_in_words(summary: dict) -> str:
    """summary.json's MFU for the run's summary line: a percentage, or why there is none."""
    value = summary.get("mfu")
    if value is None:
        return "n/a"
    if value <= 1:
        return f"{value:.1%}"
    return f"n/a ({peak_low(value, summary.get('peak_flops'), summary.get('peak_flops_source'))})"


def peak_low(value: float, peak_flops: float | None, source: str | None) -> str:
    """Why an MFU above 100% (`value`) is not a figure: the peak it is of is low; of a profile
    measured beside other work, because of that work."""
    of = f"the {peak_flops / 1e9:,.1f} GFLOP/s peak" if peak_flops else "the peak"
    if BESIDE_OTHER_WORK in (source or ""):
        return (f"the profile's peak is low, measured while other work kept the machine busy: "
                f"the run's model FLOP/s are {value:.0%} of {of}")
    how = "measured" if (source or "").startswith("measured") else "given"
    return f"peak {how} low: the run's model FLOP/s are {value:.0%} of {of}"
