"""Where a prediction's error goes: configurations of bench/sim_accuracy.py trained with their
trace on, beside the same plans simulated; per rank and op, seconds per step measured and
predicted.

bench/sim_accuracy.py says by how much a step's prediction misses; this says in which actions.
Per rank the ops are summed into three groups: compute (F, R, B, BI, BW, U: the rank's own
work), waits (WRA, WGS, WN, ...: the rank blocked on a transfer or collective, so mostly
another rank's lateness) and the rest (starting a transfer or collective, bookkeeping). A
compute ratio that moves with the machine while the waits hold points at drift; waits that grow
with the ranks per core at a steady compute ratio point at what processor sharing leaves out.

    python bench/sim_breakdown.py --only "2x1 keep" --only "4x1 keep" [--rounds 2] [--steps 8]
        [--profile FILE] [--out FILE]

Without --profile, one `ratrain profile` repeat right before every run, and that run predicted
from it (this VM's speed moves within minutes: docs/benchmarks.md). The configurations run in
turn, their order reversed every other round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from ratrain.schedule.ir import Action
from ratrain.schedule.ops import SPECS, Op, OpClass
from ratrain.sim.profile import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sim_accuracy as sa  # noqa: E402
from sim_accuracy_configs import SETS, Config  # noqa: E402
from peers import machine  # noqa: E402
from two_nodes import LinkUnavailable  # noqa: E402

WAITS = {spec.waited_by.value for spec in SPECS.values() if spec.waited_by is not None}
GROUPS = ("compute", "waits", "rest")


def group(op: str) -> str:
    """An op code's group: compute, waits or rest."""
    if op in WAITS:
        return "waits"
    return "compute" if SPECS[Op(op)].cls == OpClass.COMPUTE else "rest"


def _actions(trace: dict) -> list[dict]:
    """The spans of the ranks' `actions` tracks (not their async transfers)."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    return [e for e in trace["traceEvents"]
            if e["ph"] == "X" and names.get((e["pid"], e["tid"])) == "actions"]


def measured_per_op(trace: dict) -> dict[int, dict[str, float]]:
    """Per rank, per op code: seconds per step of its actions in an executor trace (the
    `actions` track; every step the trace kept)."""
    total: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    steps: dict[int, set] = defaultdict(set)
    for e in _actions(trace):
        total[e["pid"]][Action.parse(e["name"]).op.value] += e["dur"] / 1e6
        steps[e["pid"]].add(e["args"]["step"])
    return {rank: {op: s / len(steps[rank]) for op, s in ops.items()}
            for rank, ops in sorted(total.items())}


def traced_step_s(trace: dict) -> float:
    """The traced steps' median time: per step, from the first rank's first action to the last
    rank's last (the per-op sums above cover these steps, not the run's median step)."""
    spans: dict[int, list[float]] = defaultdict(lambda: [float("inf"), 0.0])
    for e in _actions(trace):
        span = spans[e["args"]["step"]]
        span[0], span[1] = min(span[0], e["ts"]), max(span[1], e["ts"] + e["dur"])
    return statistics.median(t1 - t0 for t0, t1 in spans.values()) / 1e6


def simulated_per_op(sim) -> dict[int, dict[str, float]]:
    """Per stage, per op code: the simulated step's seconds in its actions."""
    out = {}
    for r in sim.ranks:
        ops: dict[str, float] = defaultdict(float)
        for action, t0, t1 in r.actions:
            ops[action.op.value] += t1 - t0
        out[r.stage] = dict(ops)
    return out


def grouped(per_op: dict[str, float]) -> dict[str, float]:
    sums = dict.fromkeys(GROUPS, 0.0)
    for op, s in per_op.items():
        sums[group(op)] += s
    return sums


def row(c: Config, got: dict, profile, link: str) -> dict:
    """One run of a configuration beside its prediction, per rank (ranks in the pp-dp order:
    rank s * dp + r is stage s's replica r)."""
    sim, _ = sa._simulated(c, link, profile)
    predicted = simulated_per_op(sim)
    return {"config": c.label, "step_time_s": {"measured": got["step_time_s"],
                                               "traced": traced_step_s(got["trace"]),
                                               "predicted": sim.step_time},
            "ranks": [{"rank": rank, "stage": rank // c.dp, "measured": ops,
                       "predicted": predicted[rank // c.dp]}
                      for rank, ops in measured_per_op(got["trace"]).items()]}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def report(result: dict) -> str:
    lines = []
    for r in result["rows"]:
        step = r["step_time_s"]
        lines.append(f"{r['config']} (round {r['round']}): step {step['measured']:.3f} s "
                     f"measured (the traced steps: {step['traced']:.3f} s), "
                     f"{step['predicted']:.3f} s predicted "
                     f"({(step['predicted'] - step['measured']) / step['measured']:+.1%})")
        lines.append("  rank  " + "".join(f"{g + ': measured / predicted s (ratio)':<44}"
                                          for g in GROUPS))
        for rank in r["ranks"]:
            m, p = grouped(rank["measured"]), grouped(rank["predicted"])
            lines.append(f"  {rank['rank']:<6}" + "".join(
                f"{f'{m[g]:.3f} / {p[g]:.3f} ({_ratio(m[g], p[g])})':<44}" for g in GROUPS))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", required=True,
                    help="a configuration's label in bench/sim_accuracy.py (repeat for more)")
    ap.add_argument("--profile", help="a profile YAML; default: a `ratrain profile` repeat "
                                      "right before every run")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--link", default="200mbit", help="tc rate of the two-node link")
    ap.add_argument("--out", default=str(sa.ROOT / "bench/results/sim_breakdown.json"))
    args = ap.parse_args()
    sa.refuse_too_few_steps(ap, args.steps)
    # every set's: `all` leaves out the threads and tokens sets
    by_label = {c.label: c for configs in SETS.values() for c in configs}
    unknown = [label for label in args.only if label not in by_label]
    if unknown:
        ap.error(f"--only: no configuration {', '.join(map(repr, unknown))} in "
                 f"bench/sim_accuracy.py")
    configs = [by_label[label] for label in args.only]
    fixed = load_profile(args.profile) if args.profile else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for c in (configs if r % 2 == 0 else configs[::-1]):
                work = Path(tmp) / f"{len(rows)}"
                profile = fixed or sa._profile_repeat(Path(tmp) / f"profile-{len(rows)}.yaml")
                try:
                    got = sa._measure_config(c, sa._config(c, args.steps), work, args.link,
                                             trace=True)
                except LinkUnavailable as e:
                    print(f"{c.label}: skipped, no two-node link here ({e})", file=sys.stderr)
                    continue
                rows.append({**row(c, got, profile, args.link), "round": r + 1,
                             "profile": profile.to_dict()})
                print(f"round {r + 1}: {c.label}: {got['step_time_s']:.3f} s", file=sys.stderr,
                      flush=True)
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "argv": sys.argv[1:], "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(report(result))


if __name__ == "__main__":
    main()
