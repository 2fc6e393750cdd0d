"""Curves over the optimizer steps: the loss, and the throughput with its MFU."""

from __future__ import annotations

import math
from pathlib import Path

from ratrain.report.figure import pyplot, save


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_loss(metrics: list[dict], path: Path, title: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    steps = [r["step"] for r in metrics]
    whose = _apart(metrics)
    if whose:
        _plot_apart(ax, metrics, whose)
    ax.plot(steps, [r["loss"] for r in metrics], lw=1.2, marker="." if len(steps) < 30 else None,
            color="tab:blue", label="training loss" + (f" ({whose}s' mean)" if whose else ""))
    val = [r for r in metrics if r.get("val_loss") is not None]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color="tab:red",
                label="validation loss")
    ax.set_xlabel("optimizer step")
    _integer_steps(ax)
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, path)


def _apart(metrics: list[dict]) -> str | None:
    """Whose own losses the rows hold (--sync diloco): "island" with islands=K (an island's
    replicas share its weights, so its loss is what drifts), "replica" without; else None."""
    for who in ("island", "replica"):
        if any(r.get(f"loss_per_{who}") for r in metrics):
            return who
    return None


def _plot_apart(ax, metrics: list[dict], who: str) -> None:
    """One faint line for each island's (replica's) own loss, on its own weights."""
    rows = [r for r in metrics if r.get(f"loss_per_{who}")]
    for k in range(len(rows[0][f"loss_per_{who}"])):
        ax.plot([r["step"] for r in rows], [r[f"loss_per_{who}"][k] for r in rows], lw=0.6,
                color="0.6", label=f"each {who}'s own" if k == 0 else None)


def plot_throughput(metrics: list[dict], path: Path, title: str) -> Path:
    """Tokens/s above, MFU below, on one step axis (the first step pays for warm-up)."""
    plt = pyplot()
    with_mfu = any(r.get("mfu") is not None for r in metrics)
    fig, axes = plt.subplots(2 if with_mfu else 1, 1, figsize=(7.5, 5.6 if with_mfu else 3.4),
                             sharex=True, squeeze=False)
    steps = [r["step"] for r in metrics]
    marker = "." if len(steps) < 30 else None
    top = axes[0][0]
    top.plot(steps, [r["tokens_per_s"] for r in metrics], lw=1.2, marker=marker, color="tab:blue")
    top.set_ylabel("throughput (tokens/s)")
    top.set_ylim(bottom=0)
    top.set_title(title)
    top.grid(alpha=0.3)
    if with_mfu:
        bottom = axes[1][0]
        _plot_mfu(bottom, metrics, marker)
        bottom.set_ylim(bottom=0)
        bottom.grid(alpha=0.3)
    axes[-1][0].set_xlabel("optimizer step")
    _integer_steps(axes[-1][0])
    return save(fig, path)


def _plot_mfu(ax, metrics: list[dict], marker: str | None) -> None:
    """Each step's MFU, but for those above 100%: no run does more than its peak, so there the
    peak is low (training/mfu.peak_low), not the MFU a figure; the line breaks there (nan)
    and the legend says they are left out."""
    rows = [r for r in metrics if r.get("mfu") is not None]
    over = [r["mfu"] for r in rows if r["mfu"] > 1]
    shown = [100 * r["mfu"] if r["mfu"] <= 1 else math.nan for r in rows]
    ax.plot([r["step"] for r in rows], shown, lw=1.2, marker=marker, color="tab:green",
            label="MFU" if over else None)
    if over:
        ax.plot([], [], " ", label=f"{len(over)} step(s) left out, at up to {max(over):.0%}: "
                                   "above 100%, the peak is low")
        ax.legend(loc="lower right", fontsize="small")
    if len(over) == len(rows):  # nothing drawn: the percent scale, not matplotlib's 0-0.05
        ax.set_ylim(0, 100)
    ax.set_ylabel("MFU (% of peak FLOP/s)")
