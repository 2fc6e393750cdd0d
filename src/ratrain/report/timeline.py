"""One step's timeline: a row per rank (measured, from trace.json) or per stage (simulated,
replicas are identical), its actions coloured by kind; asynchronous work (sends, receives,
syncs, reloads: from the action that started it to its completion) on lanes of its own below.
The measured and the simulated step share one time axis."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ratrain.report.figure import DPI, pyplot, save
from ratrain.runtime.trace import lanes as trace_lanes
from ratrain.schedule.ops import SPECS, Op

# op (schedule/ops.py) -> kind; a wait takes its start's kind (its spec's `waits`); the test
# of the kinds checks that every op has one
KIND_OF_OP = {Op.FORWARD: "forward", Op.BACKWARD: "backward", Op.BACKWARD_INPUT: "backward",
              Op.BACKWARD_WEIGHT: "backward", Op.RECOMPUTE: "recompute",
              Op.SEND_ACT: "send", Op.SEND_GRAD: "send", Op.RECV_ACT: "receive",
              Op.RECV_GRAD: "receive", Op.GRAD_SYNC: "gradient sync",
              Op.GRAD_REDUCE: "gradient sync", Op.CROSS_SYNC: "gradient sync",
              Op.TIED_SYNC: "gradient sync", Op.GRAD_NORM: "gradient sync",
              Op.START_NORM: "gradient sync", Op.UPDATE: "update", Op.START_UPDATE: "update",
              Op.OUTER_SYNC: "outer sync", Op.PREFETCH: "prefetch", Op.RELEASE: "prefetch",
              Op.OFFLOAD: "offload", Op.RELOAD: "offload", Op.STEP_END: "step end"}
KIND_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "recompute": "#8172B3",
               "send": "#55A868", "receive": "#64B5CD", "gradient sync": "#C44E52",
               "outer sync": "#2A9D8F", "update": "#937860", "prefetch": "#DA8BC3",
               "offload": "#8C8C8C", "step end": "#333333", "other": "#CCB974"}
WIDTH_IN = 13.0
_CODE = re.compile(r"^([A-Z]+)")


def kind_of(name: str) -> tuple[str, bool]:
    """(kind, is a wait) of an action's or span's name: 'WGS3' is a wait of a gradient sync;
    what is no op's (the simulator's 'fold copy' spans) is 'other'."""
    m = _CODE.match(name)
    try:
        op = Op(m.group(1) if m else "")
    except ValueError:
        return "other", False
    start = SPECS[op].waits
    return KIND_OF_OP.get(start or op, "other"), start is not None


Span = tuple[str, float, float]  # (name, start s, end s)


@dataclass
class Row:
    label: str
    actions: list[Span]
    spans: list[Span]  # asynchronous work


@dataclass
class Step:
    title: str
    rows: list[Row]

    @property
    def duration(self) -> float:
        return max((t1 for r in self.rows for _, _, t1 in r.actions + r.spans), default=0.0)


def measured_step(trace: dict) -> tuple[int, Step] | None:
    """The last step in a Chrome trace written by trace.py: (its step as metrics.jsonl counts
    it, its rows), times in seconds from the step's first action on any rank."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return None
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    step = max(e.get("args", {}).get("step", 0) for e in spans)
    mine = [e for e in spans if e.get("args", {}).get("step", 0) == step]
    t0 = min(e["ts"] for e in mine)
    rows = []
    for pid in sorted({e["pid"] for e in mine}):
        of = [e for e in mine if e["pid"] == pid]
        as_span = lambda e: (e["name"], (e["ts"] - t0) / 1e6, (e["ts"] + e["dur"] - t0) / 1e6)
        rows.append(Row(names.get(pid, f"rank {pid}"),
                        [as_span(e) for e in of if e["tid"] == 0],
                        [as_span(e) for e in of if e["tid"] != 0]))
    # traces written before they said where their steps count from count from 0
    steps_from = (trace.get("otherData") or {}).get("steps_from", 0)
    return step + 1 - steps_from, Step("measured", rows)


def simulated_step(result, profile_name: str) -> Step:
    rows = [Row(f"stage {r.stage} (simulated)", [(str(a), t0, t1) for a, t0, t1 in r.actions],
                list(r.spans)) for r in result.ranks]
    return Step(f"simulated on profile {profile_name}", rows)


def lanes(spans: list[Span]) -> list[int]:
    """A lane for each span such that spans of one lane do not overlap (trace.lanes)."""
    return trace_lanes([(t0, t1) for _, t0, t1 in spans])


def _draw(ax, step: Step, x_max: float) -> set[str]:
    """Draws the step's rows top-down; returns the kinds drawn."""
    ms = 1e3
    px_per_s = WIDTH_IN * 0.85 * DPI / x_max  # about: the axes take most of the figure
    y, ticks, labels, kinds = 0.0, [], [], set()

    def bars(items: list[Span], row_y: float, height: float, named: bool) -> None:
        groups: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for name, t0, t1 in items:
            kind, wait = kind_of(name)
            groups.setdefault((kind, wait), []).append((t0 * ms, max(t1 - t0, 0) * ms))
            if named and (t1 - t0) * px_per_s > 4.5 * len(name) + 6 and not wait:
                ax.text((t0 + t1) / 2 * ms, row_y, name, ha="center", va="center", fontsize=6,
                        color="white", clip_on=True)
        for (kind, wait), xranges in groups.items():  # one collection per kind: fast to draw
            kinds.add(kind)
            color = KIND_COLORS[kind]
            ax.broken_barh(xranges, (row_y - height / 2, height), facecolors=color,
                           alpha=0.55 if wait else 1.0, hatch="////" if wait else None,
                           edgecolors=color if wait else "white", linewidth=0.3)

    for row in step.rows:
        bars(row.actions, y, 0.8, True)
        ticks.append(y)
        labels.append(row.label)
        lane_of = lanes(row.spans)
        for lane in range(max(lane_of, default=-1) + 1):
            y += 0.6
            bars([s for s, k in zip(row.spans, lane_of) if k == lane], y, 0.45, False)
            ticks.append(y)
            labels.append("async")
        y += 1.1
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(y - 0.6, -0.7)
    ax.set_title(step.title, fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
    return kinds


def _height(step: Step) -> float:
    return sum(1.1 + 0.6 * (max(lanes(r.spans), default=-1) + 1) for r in step.rows)


def plot_timeline(measured: Step | None, simulated: Step | None, path: Path,
                  title: str) -> Path | None:
    steps = [s for s in (measured, simulated) if s is not None]
    if not steps:
        return None
    plt = pyplot()
    heights = [_height(s) for s in steps]
    fig, axes = plt.subplots(len(steps), 1, sharex=True, squeeze=False,
                             figsize=(WIDTH_IN, 1.4 + 0.32 * sum(heights) + 0.5 * len(steps)),
                             gridspec_kw={"height_ratios": heights})
    x_max = max(s.duration for s in steps)
    kinds = set()
    for ax, step in zip(axes[:, 0], steps):
        kinds |= _draw(ax, step, x_max)
    axes[-1][0].set_xlim(0, x_max * 1e3 * 1.01)
    axes[-1][0].set_xlabel("time since the start of the step (ms)")
    from matplotlib.patches import Patch

    handles = [Patch(color=KIND_COLORS[k], label=k) for k in KIND_COLORS if k in kinds]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="////",
                         label="wait (for the kind's start)"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, 0.0), frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save(fig, path)
