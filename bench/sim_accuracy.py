"""The simulator against measurement: predicted and measured step time and peak memory per rank.

On this machine: a profile measured by `ratrain profile` (or --profile FILE), then for each
configuration a real `ratrain train --plan FILE` run (its own processes, gloo, 1 thread per
rank) and `simulate` on the very same plan. Configurations cover pp, dp, micro-batching, both
policies, activation policies, and two runs as two nodes over a tbf rate-limited link between
network namespaces (root; skipped with a line where namespaces cannot be made).

Every configuration runs once per round (`--rounds`, the order reversed in even rounds, so a
shared machine's drift hits all alike). Measured: the median step time over the steps after the
first two, its median over rounds; per rank the executor's ledger peak and the process's peak
RSS growth (metrics.jsonl; RSS: median over rounds). Predicted: the simulated step
time; per stage the simulated ledger peak, and the RSS growth it implies (RankTimeline.rss_growth:
the ledger's growth from before the first step plus the profile's process overhead). The error of each is (predicted - measured) / measured.

    python bench/sim_accuracy.py [--profile FILE] [--steps 10] [--rounds 2] [--link 200mbit] [--out bench/results/sim_accuracy.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.metrics import read_metrics
from ratrain.models.presets import get_preset
from ratrain.schedule.plan import build_plan
from ratrain.sim.profile import Link, LinkClass, load_profile
from ratrain.sim.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402
from two_nodes import LinkUnavailable, TwoNodes, parse_rate  # noqa: E402

# (label, pp, dp, global batch, policy, activation per stage, over the link)
CONFIGS = [
    ("1x1 keep", 1, 1, 8, "ratrain", ["keep"], False),
    ("2x1 keep", 2, 1, 8, "ratrain", ["keep"] * 2, False),
    ("2x1 keep, 8 micro", 2, 1, 16, "ratrain", ["keep"] * 2, False),
    ("2x1 baseline", 2, 1, 8, "baseline", ["keep"] * 2, False),
    ("2x1 recompute", 2, 1, 8, "ratrain", ["recompute"] * 2, False),
    ("2x1 recompute,keep", 2, 1, 8, "ratrain", ["recompute", "keep"], False),
    ("1x2 ratrain", 1, 2, 8, "ratrain", ["keep"], False),
    ("1x2 baseline", 1, 2, 8, "baseline", ["keep"], False),
    ("2x2 ratrain", 2, 2, 16, "ratrain", ["keep"] * 2, False),
    ("4x1 keep", 4, 1, 8, "ratrain", ["keep"] * 4, False),
    ("1x2 ratrain, link", 1, 2, 8, "ratrain", ["keep"], True),
    ("1x2 baseline, link", 1, 2, 8, "baseline", ["keep"], True),
]
MODEL, SEQ, MICRO = "tiny", 256, 2


def _config(pp: int, dp: int, global_batch: int, steps: int) -> RunConfig:
    cfg = RunConfig(model=get_preset(MODEL))
    t = cfg.train
    t.seq_len, t.global_batch, t.micro_batch_size = SEQ, global_batch, MICRO
    t.steps, t.eval_batches, t.checkpoint_every, t.warmup_steps = steps, 0, 0, 0
    cfg.parallel.pp, cfg.parallel.dp = pp, dp
    return cfg


def _measure(cfg: RunConfig, plan, work: Path, link: TwoNodes | None) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.save(work / "config.yaml")
    run_dir = work / "run"
    args = ["train", "--config", str(work / "config.yaml"), "--plan", str(work / "plan.json"),
            "--run-dir", str(run_dir), "--no-progress", "--no-trace"]
    if link is None:
        proc = subprocess.run([sys.executable, "-m", "ratrain.cli", *args], capture_output=True,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode:
            raise SystemExit(proc.stderr.strip())
    else:
        link.run(cfg.parallel.pp * cfg.parallel.dp // 2, ["-m", "ratrain.cli", *args],
                 port=29611, log_dir=work)
    rows = read_metrics(run_dir / "metrics.jsonl")
    return {"step_time_s": statistics.median(r["step_time_s"] for r in rows[2:]),
            "ledger": rows[-1]["ledger_peak_bytes_per_rank"],
            "rss_growth": rows[-1].get("rss_growth_bytes_per_rank")}


def _over_link(profile, rate_bits: float, world: int):
    """Two nodes of world/2 ranks each, joined by a link of the tbf rate (latency: loopback's)."""
    link = Link(rate_bits / 8, profile.intra_node.p2p.latency)
    return dataclasses.replace(profile, devices_per_node=world // 2,
                               inter_node=LinkClass(p2p=link, collective=link))


def _plan(cfg: RunConfig, policy: str, activation: list[str]):
    p = cfg.parallel
    return build_plan(cfg.model.n_layers, p.pp, p.dp, cfg.n_micro, policy=policy,
                      activation=activation if p.pp > 1 else activation[0])


def _per_stage(per_rank: list, pp: int, dp: int) -> list:
    """The largest of each stage's replicas (ranks in the pp-dp order)."""
    return [max(per_rank[s * dp + r] for r in range(dp)) for s in range(pp)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a profile YAML; default: measure one with `ratrain profile`")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--link", default="200mbit", help="tc rate of the two-node link")
    ap.add_argument("--only", help="comma-separated labels to run")
    ap.add_argument("--out", default=str(ROOT / "bench/results/sim_accuracy.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        profile_path = args.profile
        if profile_path is None:
            profile_path = str(tmp / "profile.yaml")
            subprocess.run([sys.executable, "-m", "ratrain.cli", "profile", "--model", MODEL,
                            "--seq-len", str(SEQ), "--micro-batch-size", str(MICRO),
                            "--out", profile_path], check=True)
        profile = load_profile(profile_path)
        configs = [c for c in CONFIGS if not args.only or c[0] in args.only.split(",")]
        runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
        for r in range(args.rounds):  # alternate the order: a shared machine's drift hits all
            for label, pp, dp, gb, policy, activation, linked in (configs if r % 2 == 0 else configs[::-1]):
                cfg = _config(pp, dp, gb, args.steps)
                plan = _plan(cfg, policy, activation)
                work = tmp / f"{label.replace(' ', '_')}-{r}"
                try:
                    if linked:
                        with TwoNodes(args.link) as nodes:
                            runs[label].append(_measure(cfg, plan, work, nodes))
                    else:
                        runs[label].append(_measure(cfg, plan, work, None))
                except LinkUnavailable as e:
                    print(f"{label}: skipped, no two-node link here ({e})", file=sys.stderr)
                    continue
                print(f"round {r + 1}: {label}: {runs[label][-1]['step_time_s']:.3f} s",
                      file=sys.stderr, flush=True)
        rows = []
        for label, pp, dp, gb, policy, activation, linked in configs:
            if not runs[label]:
                continue
            cfg = _config(pp, dp, gb, args.steps)
            plan = _plan(cfg, policy, activation)
            used = _over_link(profile, parse_rate(args.link), pp * dp) if linked else profile
            sim = simulate(plan, cfg.model, used, micro_batch_size=MICRO, seq_len=SEQ)
            got = runs[label]
            ledger = _per_stage(got[0]["ledger"], pp, dp)
            rss = ([statistics.median(_per_stage(g["rss_growth"], pp, dp)[s] for g in got)
                    for s in range(pp)] if got[0]["rss_growth"] else None)
            rows.append({
                "config": label, "pp": pp, "dp": dp, "n_micro": cfg.n_micro, "policy": policy,
                "activation": activation, "link": args.link if linked else None,
                "step_time_s": {"predicted": sim.step_time,
                                "measured": statistics.median(g["step_time_s"] for g in got),
                                "measured_per_round": [g["step_time_s"] for g in got]},
                "ledger_bytes": {"predicted": [r.peak for r in sim.ranks], "measured": ledger,
                                 "same_every_round": all(g["ledger"] == got[0]["ledger"] for g in got)},
                "rss_growth_bytes": {"predicted": [r.rss_growth(used.device) for r in sim.ranks],
                                     "measured": rss},
                "predicted_bubble": sim.bubble,
            })
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:],
              "profile": profile.to_dict(), "model": MODEL, "seq_len": SEQ,
              "micro_batch_size": MICRO, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))


def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def table(result: dict) -> str:
    head = ["config", "n_micro", "step predicted (s)", "measured (s)", "error",
            "stage: ledger predicted / measured MiB (error)", "RSS growth predicted / measured MiB (error)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    errors = []
    for row in result["rows"]:
        st = row["step_time_s"]
        e = _err(st["predicted"], st["measured"])
        errors.append(abs(e))
        led, rss = row["ledger_bytes"], row["rss_growth_bytes"]
        mib = 2 ** 20
        ledger_cells = "; ".join(
            f"{s}: {p / mib:.1f} / {m / mib:.1f} ({_err(p, m):+.1%})"
            for s, (p, m) in enumerate(zip(led["predicted"], led["measured"])))
        rss_cells = "-" if rss["measured"] is None else "; ".join(
            f"{s}: {p / mib:.1f} / {m / mib:.1f} ({_err(p, m):+.1%})"
            for s, (p, m) in enumerate(zip(rss["predicted"], rss["measured"])))
        lines.append(f"| {row['config']} | {row['n_micro']} | {st['predicted']:.3f} | "
                     f"{st['measured']:.3f} | {e:+.1%} | {ledger_cells} | {rss_cells} |")
    if errors:
        lines.append(f"\nstep time: median |error| {statistics.median(errors):.1%}, "
                     f"largest {max(errors):.1%}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
