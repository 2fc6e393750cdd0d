"""Curves over the optimizer steps: the loss, and the throughput with its MFU."""

from __future__ import annotations

from pathlib import Path

from ratrain.report.figure import pyplot, save


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_loss(metrics: list[dict], path: Path, title: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    steps = [r["step"] for r in metrics]
    apart = [r for r in metrics if r.get("loss_per_replica")]  # --sync diloco
    for k in range(len(apart[0]["loss_per_replica"]) if apart else 0):
        ax.plot([r["step"] for r in apart], [r["loss_per_replica"][k] for r in apart], lw=0.6,
                color="0.6", label="each replica's own" if k == 0 else None)
    ax.plot(steps, [r["loss"] for r in metrics], lw=1.2, marker="." if len(steps) < 30 else None,
            color="tab:blue", label="training loss" + (" (replicas' mean)" if apart else ""))
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
        rows = [r for r in metrics if r.get("mfu") is not None]
        bottom.plot([r["step"] for r in rows], [100 * r["mfu"] for r in rows], lw=1.2,
                    marker=marker, color="tab:green")
        bottom.set_ylabel("MFU (% of peak FLOP/s)")
        bottom.set_ylim(bottom=0)
        bottom.grid(alpha=0.3)
    axes[-1][0].set_xlabel("optimizer step")
    _integer_steps(axes[-1][0])
    return save(fig, path)
