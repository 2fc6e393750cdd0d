"""Memory per pipeline stage: what the executor's ledger held at its peak, by kind; what the
simulator predicts it holds; what the process measured (RSS growth on a CPU,
max_memory_allocated on CUDA); and the plan's budget."""

from __future__ import annotations

from pathlib import Path

from ratrain.byte_units import decimal_bytes
from ratrain.report import run_figures
from ratrain.report.figure import pyplot, save

# the ledger's kinds, in stacking order; "total": the one bar of a run that did not reach its end
KIND_COLORS = {"masters": "#4C72B0", "views": "#64B5CD", "gradients": "#DD8452",
               "optimizer": "#C44E52", "activations": "#55A868", "offloaded": "#8C8C8C",
               "buffers": "#CCB974", "total": "#6A7FA8"}


def stage_ledgers(run) -> list[dict[str, int]] | None:
    """Per stage, the ledger by kind at its peak of the stage's replica that held the most;
    a run that did not reach its end (which gathers them by kind) has its peaks' totals only:
    {"total": bytes}."""
    per_rank = run.summary.get("ledger_at_peak_by_kind_per_rank")
    if not per_rank or any(not isinstance(d, dict) for d in per_rank):
        totals = run_figures.per_stage(run, "ledger_peak_bytes")
        return [{"total": n} for n in totals] if totals else None
    grid = run_figures.grid(run)
    best: dict[int, dict[str, int]] = {}
    for rank, kinds in enumerate(per_rank):
        stage = grid.coords(rank)[0]
        if stage not in best or sum(kinds.values()) > sum(best[stage].values()):
            best[stage] = kinds
    return [best[s] for s in sorted(best)]


def measured_per_stage(run) -> tuple[str, list[float]] | None:
    """(what was measured, its peak per stage)."""
    rss = run_figures.per_stage(run, "rss_growth_bytes")
    if rss:
        return "measured: peak RSS growth", list(rss)
    per_rank = (run_figures.latest(run.metrics, "peak_memory_bytes_per_rank")
                or [run.metrics[-1].get("peak_memory_bytes")])
    if any(v is None for v in per_rank):
        return None
    grid = run_figures.grid(run)
    out = [0.0] * grid.pp
    for rank, v in enumerate(per_rank):
        out[grid.coords(rank)[0]] = max(out[grid.coords(rank)[0]], v)
    return "measured: peak allocated (CUDA)", out


def axis_unit(largest: float) -> tuple[float, str]:
    """The axis's bytes per unit and its name: decimal, as decimal_bytes (and so the report's
    table and the planner) writes sizes; GB from a gigabyte up."""
    return (1e9, "GB") if largest >= 1e9 else (1e6, "MB")


def plot_memory(run, sim, path: Path) -> Path | None:
    """Grouped bars per stage; None if the run measured nothing per stage."""
    ledgers = stage_ledgers(run)
    measured = measured_per_stage(run)
    if ledgers is None and measured is None:
        return None
    simulated = [r.at_peak for r in sim.result.ranks] if sim else None
    n_stages = max(len(x) for x in (ledgers, measured and measured[1], simulated) if x)
    groups = [g for g in ("ledger", "sim", "measured")
              if {"ledger": ledgers, "sim": simulated, "measured": measured}[g]]
    width = 0.8 / len(groups) if len(groups) > 1 else 0.35
    scale, unit = axis_unit(max([sum(d.values()) for d in (ledgers or []) + (simulated or [])]
                                + (measured[1] if measured else []) + [run.budget_bytes or 0]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(groups) * n_stages + 3.4), 4.2))
    seen = set()
    for g, group in enumerate(groups):
        xs = [s - 0.4 + width * (g + 0.5) for s in range(n_stages)]
        if group in ("ledger", "sim"):
            stacks = ledgers if group == "ledger" else simulated
            bottom = [0.0] * len(stacks)
            for kind, color in KIND_COLORS.items():
                heights = [d.get(kind, 0) / scale for d in stacks]
                if not any(heights):
                    continue
                label = None if kind in seen else "ledger, its total" if kind == "total" else kind
                seen.add(kind)
                ax.bar(xs[:len(stacks)], heights, width * 0.92, bottom=bottom, color=color,
                       label=label, edgecolor="white" if group == "ledger" else "black",
                       hatch=None if group == "ledger" else "//", linewidth=0.5)
                bottom = [b + h for b, h in zip(bottom, heights)]
            for x, total in zip(xs, bottom):
                ax.annotate(f"{total:,.1f}", (x, total), ha="center", va="bottom", fontsize=8)
        else:
            values = [v / scale for v in measured[1]]
            ax.bar(xs[:len(values)], values, width * 0.92, color="#555555", label=measured[0])
            for x, v in zip(xs, values):
                ax.annotate(f"{v:,.1f}", (x, v), ha="center", va="bottom", fontsize=8)
            if sim and "RSS" in measured[0]:  # the simulator predicts the growth too
                predicted = [r.rss_growth(sim.result.device) / scale for r in sim.result.ranks]
                ax.hlines(predicted, [x - width * 0.46 for x in xs], [x + width * 0.46 for x in xs],
                          colors="black", linestyles="--", lw=1.5, label="simulated RSS growth")
    if run.budget_bytes:
        ax.axhline(run.budget_bytes / scale, color="red", ls="--", lw=1.2,
                   label=f"plan's budget ({decimal_bytes(run.budget_bytes)})")
    names = {"ledger": "ledger", "sim": "simulated", "measured": measured and measured[1] and
             ("RSS growth" if "RSS" in measured[0] else "allocated")}
    ticks = [(s - 0.4 + width * (g + 0.5), names[group]) for s in range(n_stages)
             for g, group in enumerate(groups)]
    ax.set_xticks([x for x, _ in ticks])
    ax.set_xticklabels([name for _, name in ticks], fontsize=8)
    from matplotlib.transforms import blended_transform_factory

    below = blended_transform_factory(ax.transData, ax.transAxes)
    for s in range(n_stages):
        ax.text(s, -0.11, f"stage {s}", transform=below, ha="center", va="top", fontsize=10)
    ax.set_ylabel(f"memory at its peak ({unit})")
    ax.set_title("Memory per stage at its peak" + _title_of(run, ledgers, "sim" in groups),
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.08)
    ax.set_xlim(-0.6, n_stages - 0.4)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return save(fig, path)


def _title_of(run, ledgers, simulated: bool) -> str:
    text = ": the executor's ledger, the simulator's (hatched), measured" if simulated else ""
    if not ledgers:
        text += ("\n(the plain engine keeps no ledger)" if run.plain_engine
                 else "\n(metrics.jsonl records no ledger)")
    elif "total" in ledgers[0]:
        text += ("\n(the ledger's totals: a run gathers them by kind at its end, which this one "
                 "did not reach)")
    return text
