"""What `ratrain profile` prints: the measured figures of a profile as a table."""

from __future__ import annotations

from ratrain.byte_units import decimal_bytes
from ratrain.profiling.ranks import KINDS
from ratrain.sim.profile import HardwareProfile, Link


def summary_rows(profile: HardwareProfile) -> tuple[list[str], list[list[str]]]:
    """What `ratrain profile` prints: (header, rows) of its measured figures."""
    d, m = profile.device, profile.measured[0]
    rows = [[f"{kind} forward / backward",
             f"{_fmt_s(getattr(m, kind).forward_s)} / {_fmt_s(getattr(m, kind).backward_s)}"]
            for kind in KINDS]
    rows += [[f"{kind} split backward: BI / BW",
              f"{_fmt_s(t.backward_input_s)} / {_fmt_s(t.backward_weight_s)}"]
             for kind, t in ((kind, getattr(m, kind)) for kind in KINDS)
             if t.backward_input_s is not None]
    rows.append(["block forward, no grad", _fmt_s(m.block_forward_no_grad_s)])
    for fewer in profile.measured[1:]:
        rows.append([f"block forward / backward, micro-batch {fewer.micro_batch_size} x "
                     f"{fewer.seq_len}", f"{_fmt_s(fewer.block.forward_s)} / "
                                         f"{_fmt_s(fewer.block.backward_s)}"])
    for dtype, rate in d.compute.items():
        rows.append([f"peak {dtype} (matmul)", _fmt_rate(rate.peak_flops, "FLOP/s")])
    rate = d.compute[m.dtype]
    if rate.attention_efficiency is None:
        rows.append([f"block efficiency ({m.dtype})", f"{rate.efficiency:.2f}"])
    else:
        rows.append([f"efficiency ({m.dtype}): block without attention / attention's core",
                     f"{rate.efficiency:.2f} / {rate.attention_efficiency:.2f}"])
    rows.append(["memory bandwidth (AdamW)", _fmt_rate(d.memory_bandwidth, "B/s")])
    if d.host_memory_bandwidth:
        rows.append(["host memory bandwidth (AdamW on the host)",
                     _fmt_rate(d.host_memory_bandwidth, "B/s")])
    if d.host_link:
        rows.append(["host link", _fmt_link(d.host_link)])
    rows.append(["link p2p", _fmt_link(profile.intra_node.p2p)])
    rows.append(["link all_reduce (per hop)", _fmt_link(profile.intra_node.collective)])
    rows.append(["action overhead", _fmt_s(d.action_overhead_s)])
    rows.append(["compute slowdown, all cores busy", f"{d.contention:.0%}"])
    if d.thread_efficiency is not None:
        rows.append(["one process on every core: each thread beyond one adds",
                     f"{d.thread_efficiency:.0%} of one thread's speed"])
    rows.append(["process memory beyond the ledger", f"{decimal_bytes(d.process_overhead_bytes)} "
                 f"+ {d.process_overhead_per_byte:.2f} x its growth"])
    rows.append(["memory per device", decimal_bytes(d.memory_bytes)])
    return ["figure", "value"], rows


def _fmt_s(s: float) -> str:
    for scale, unit in ((1, "s"), (1e-3, "ms")):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e6:.3g} us"


def _fmt_rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G")):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x / 1e6:.3g} M{unit}"


def _fmt_link(link: Link) -> str:
    return f"{_fmt_rate(link.bandwidth, 'B/s')} + {_fmt_s(link.latency)}"
