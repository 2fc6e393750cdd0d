"""bench/gpu_offload.py's comparison of its two rows: the loss check and the table."""

from __future__ import annotations

TOLERANCE = {"bfloat16": 2.0**-6, "float32": 1e-4}
"""The largest relative loss difference between the rows at any step (bench/gpu_offload.py's
docstring says why)."""
PEER = "fsdp2-offload"


def compare_losses(ours: list[float], peer: list[float], dtype: str) -> dict:
    diffs = [abs(a - b) / abs(b) for a, b in zip(ours, peer, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    return {"per_step_rel_diff": diffs, "max_rel_diff": diffs[worst], "at_step": worst + 1,
            "step1_rel_diff": diffs[0], "tolerance": TOLERANCE[dtype],
            "within_tolerance": diffs[worst] <= TOLERANCE[dtype]}


def summarize(rows: dict, tokens_per_step: int, flops_per_token: float, peak_flops) -> None:
    from peers import tokens_per_s

    for row in rows.values():
        if "step_times_s" in row:
            row["tokens_per_s"] = tokens_per_s(row["step_times_s"], tokens_per_step)
            row["mfu"] = flops_per_token * row["tokens_per_s"] / peak_flops if peak_flops else None


def table(result: dict) -> str:
    rows, budget = result["rows"], result["settings"]["memory_budget_bytes"]
    gb = lambda v: "-" if v is None else f"{v / 1e9:.2f}"  # noqa: E731
    lines = ["| row | micro-batches | tokens/s | MFU | peak CUDA alloc. (GB) | peak host RSS (GB) | within budget |",
             "|" + "---|" * 7]
    for name, r in rows.items():
        if "tokens_per_s" not in r:
            why = f"skipped ({r['skipped']})" if "skipped" in r else \
                f"failed: {r.get('error', '?').splitlines()[-1][:120]}"
            lines.append(f"| {name} | {why} | | | | | |")
            continue
        fits = "-" if r.get("peak_cuda_bytes") is None else "yes" if r["peak_cuda_bytes"] <= budget else "NO"
        lines.append(f"| {name} | {r['micro_batch']} | {r['tokens_per_s']:.0f} | "
                     f"{'-' if r['mfu'] is None else format(r['mfu'], '.1%')} | {gb(r.get('peak_cuda_bytes'))} | "
                     f"{gb(r['peak_host_bytes'])} | {fits} |")
    lines += predicted(rows["ratrain"])
    a, b, c = rows["ratrain"], rows[PEER], result["losses"]
    if c:
        ratio = lambda k: f"{a[k] / b[k]:.2f}" if a.get(k) and b.get(k) else "-"  # noqa: E731
        lines += [f"| ratrain / peer | | {ratio('tokens_per_s')} | {ratio('mfu')} | "
                  f"{ratio('peak_cuda_bytes')} | {ratio('peak_host_bytes')} | |",
                  "", f"| step | ratrain loss | {PEER} loss | rel. diff |", "|---|---|---|---|"]
        lines += [f"| {i + 1} | {x:.5f} | {y:.5f} | {d:.2e} |" for i, (x, y, d)
                  in enumerate(zip(a["losses"], b["losses"], c["per_step_rel_diff"]))]
        lines.append(f"\nlargest relative loss difference {c['max_rel_diff']:.2e} at step {c['at_step']} "
                     f"(step 1: {c['step1_rel_diff']:.2e}); tolerance {c['tolerance']:.2e}: "
                     + ("within" if c["within_tolerance"] else "ABOVE"))
    lines.append("peer micro-batch sizes tried: " + ", ".join(
        f"{t['micro_batch_size']} {t['outcome'].splitlines()[0][:100]}" for t in result["peer_tried"]))
    return "\n".join(lines)


def predicted(row: dict) -> list[str]:
    """ratrain's measured rate and peaks against its plan's prediction, where it ran one."""
    p = row.get("prediction")
    if not p or "tokens_per_s" not in row:
        return []
    gb = lambda v: f"{v / 1e9:.2f} GB"  # noqa: E731
    line = (f"ratrain's plan predicted {p['tokens_per_s']:.0f} tokens/s: measured "
            f"{row['tokens_per_s'] / p['tokens_per_s'] - 1:+.1%}; device peak "
            f"{gb(max(p['stage_peak_bytes']))}")
    if row.get("peak_cuda_bytes") is not None:
        line += f" (measured {gb(row['peak_cuda_bytes'])} allocated)"
    if p.get("stage_host_peak_bytes"):
        line += f"; host state {gb(max(p['stage_host_peak_bytes']))} (peak host RSS " \
                f"{gb(row['peak_host_bytes'])})"
    return ["", line]


def merged(ratrain: dict, peer: dict) -> dict:
    """One result of two `--rows` runs of the same settings: ratrain's row from the first, the
    peer's from the second (each with its rate and MFU as its run computed them), the losses
    compared."""
    keys = ("model", "n_layers", "seq_len", "global_batch", "steps", "dtype", "device")
    a, b = ratrain["settings"], peer["settings"]
    differ = [k for k in keys if a.get(k) != b.get(k)]
    if differ:
        raise ValueError("the two runs' settings differ: " + ", ".join(
            f"{k} {a.get(k)} / {b.get(k)}" for k in differ))
    rows = {"ratrain": ratrain["rows"]["ratrain"], PEER: peer["rows"][PEER]}
    losses = (compare_losses(rows["ratrain"]["losses"], rows[PEER]["losses"], a["dtype"])
              if "losses" in rows["ratrain"] and "losses" in rows[PEER] else None)
    return {"benchmark": "gpu_offload", "merged_from": [ratrain.get("command"), peer.get("command")],
            "machine": ratrain.get("machine"), "settings": a, "rows": rows,
            "peer_tried": peer.get("peer_tried", []), "losses": losses}
