"""The plots and the table of bench/low_bandwidth.py's results (`--report`): loss against
tokens and against wall time, the bytes each step put on the link, and per run its tokens/s,
bytes per step (measured on the veths), peak step and the loss gap at equal tokens."""

from __future__ import annotations

import json
from pathlib import Path

from two_nodes import parse_link, parse_rate

WINDOW = 50  # steps: the loss gap compares the mean training loss over the last WINDOW steps


def _smooth(xs: list[float], k: int = 25) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def shape(d: dict) -> tuple[int, int]:
    """A run's pp and dp (2 for the runs made before dp was a choice)."""
    return d["pp"], d.get("dp", 2)


def rows(results: list[dict]) -> list[dict]:
    """One row per run, with its ratio to the synchronous run of its rate and pp (_base) and its
    loss gap to the synchronous run of equal steps and pp (the loss per step does not depend on
    the link: the same seed, batches and algorithm)."""
    ref = {(shape(d), d["steps"]): d for d in results if d["sync"] == "step"}
    out = []
    for d in sorted(results, key=lambda d: (-parse_rate(parse_link(d["rate"])[0]), shape(d),
                                            d["sync"] != "step", d["sync"])):
        timed = d["bytes_at_step"][1:]
        row = {"run": d, "mb_per_step": sum(timed) / len(timed) / 1e6,
               "peak_mb": max(timed) / 1e6,
               "loss_tail": sum(d["loss"][-WINDOW:]) / len(d["loss"][-WINDOW:])}
        base = _base(d, results)
        row["speedup"] = d["tokens_per_s"] / base["tokens_per_s"] if base else None
        same = ref.get((shape(d), d["steps"]))
        if same and same is not d:
            tail = sum(same["loss"][-WINDOW:]) / len(same["loss"][-WINDOW:])
            row["gap"] = row["loss_tail"] / tail - 1
            last = str(d["steps"])
            if last in d["val_loss"] and last in same["val_loss"]:
                row["val_gap"] = d["val_loss"][last] / same["val_loss"][last] - 1
        out.append(row)
    return out


def _base(d: dict, results: list[dict]) -> dict | None:
    """The synchronous run `d`'s tokens/s is divided by: of the same link and pp, from the same
    invocation of bench/low_bandwidth.py (run close in time on the shared machine), of the same
    steps where it has one. Results from before invocations were recorded: the synchronous run
    of the same link, pp and steps, else the shortest of that link and pp, whenever it ran."""
    same = [s for s in results if s["sync"] == "step" and s["rate"] == d["rate"]
            and shape(s) == shape(d)
            and ("invocation_utc" not in d or s.get("invocation_utc") == d["invocation_utc"])]
    return min(same, key=lambda s: (s["steps"] != d["steps"], s["steps"]), default=None)


def table(rs: list[dict]) -> str:
    unrecorded = any("invocation_utc" not in r["run"] for r in rs)
    ratio = ("x sync (invocation not recorded: over a sync run of the link and pp that may be "
             "another invocation's)" if unrecorded else "x sync (this invocation's)")
    head = (f"| link | pp | --sync | steps | tokens/s | {ratio} | MB sent per step (both nodes) | "
            f"peak step MB | train loss, last {WINDOW} steps | gap to sync | val loss at end | "
            "val gap | wall s |")
    lines = [head, "|" + "---|" * 13]
    for r in rs:
        d = r["run"]
        val = d["val_loss"].get(str(d["steps"]))
        lines.append(
            f"| {d['rate']} | {d['pp']}{'' if shape(d)[1] == 2 else f' (dp {shape(d)[1]})'} | {d['sync']} {d.get('flags', '')} | {d['steps']} | "
            f"{d['tokens_per_s']:.0f} | "
            + ("1" if d["sync"] == "step" else f"**{r['speedup']:.2f}**" if r["speedup"] else "-")
            + " | "
            f"{r['mb_per_step']:.2f} | {r['peak_mb']:.2f} | {r['loss_tail']:.4f} | "
            + (f"{r['gap']:+.2%}" if "gap" in r else "-") + " | "
            + (f"{val:.4f}" if val is not None else "-") + " | "
            + (f"{r['val_gap']:+.2%}" if "val_gap" in r else "-") + f" | {d['wall_s']:.0f} |")
    return "\n".join(lines)


def plotted(d: dict) -> bool:
    """The runs the figure shows: docs/low_bandwidth.md's long runs of pp 1, dp 2 (the short
    throughput pairs' cosine is another run's)."""
    return (shape(d) == (1, 2) and d["steps"] >= 150
            and not (d["steps"] < 600 and d["rate"] == "100mbit"))


def plots(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    names = sorted({d["sync"] + d.get("flags", "") for d in results},
                   key=lambda n: (n != "step", n))
    color = {n: f"C{i}" for i, n in enumerate(names)}  # one colour per run kind in every panel
    for d in filter(plotted, results):
        kind = d["sync"] + d.get("flags", "")
        name = f"{d['sync']} {d.get('flags', '')} {d['rate']}".replace("  ", " ")
        style = "-" if d["rate"] == "100mbit" else "--"
        tokens = [d["tokens_per_step"] * (i + 1) / 1e6 for i in range(len(d["loss"]))]
        if d["rate"] == "100mbit":
            axes[0].plot(tokens, _smooth(d["loss"]), style, label=name, lw=1.2,
                         color=color[kind])
        n = len(d["wall_at_step"])
        axes[1].plot(d["wall_at_step"], _smooth(d["loss"])[:n], style, label=name, lw=1.2,
                     color=color[kind])
        if d["rate"] == "100mbit" and d["sync"] in ("diloco:50", "diloco:50:2"):
            axes[2].plot(range(2, n + 1), [b / 1e6 for b in d["bytes_at_step"][1:]], lw=0.8,
                         label=name, color=color[kind])
    axes[0].set(xlabel="tokens (millions)", ylabel="training loss (mean of 25 steps)",
                title="loss against tokens, 100 Mbit/s")
    axes[1].set(xlabel="wall time since launch (s)", ylabel="training loss (mean of 25 steps)",
                title="loss against wall time (dashed: 50 Mbit/s)")
    axes[2].set(xlabel="step", ylabel="MB sent by both nodes in the step",
                title="bytes on the link per step (veth counters)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[1]:  # (no 100 Mbit/s run: nothing to name)
            ax.legend(fontsize=8)
    axes[0].set_ylim(top=3.0)
    axes[1].set_ylim(top=3.0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(out: Path, png: Path) -> int:
    results = json.loads(out.read_text())
    print(table(rows(results)))
    if not any(map(plotted, results)):
        print("(no figure: it shows the long pp 1, dp 2 runs, and these have none)")
        return 0
    plots(results, png)
    print(f"wrote {png}")
    return 0
