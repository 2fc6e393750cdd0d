"""The planner judged by measurement, and its plans for the paper's four models.

Part 1, measured on this machine: with a profile measured by `ratrain profile`, `ratrain plan`
for 2 local CPU ranks under a memory budget, once with `--policy ratrain` and once with
`--policy baseline` (the GPU-style runtime's best plan: one activation policy for every block,
the uniform policy that fits). Both plan files are trained with `ratrain train --plan FILE`,
interleaved in rounds (the order reversed in even rounds); measured: the median step time over
the steps after the first two, each rank's ledger peak and its peak memory (RSS growth during
training plus the masters and gradients allocated before it), against the budget.

Part 2, predicted: `ratrain plan` for llama2-7b, baichuan2-13b, qwen2.5-32b and llama2-70b on
1024 `mt3000` devices under 20e9 bytes, sequence length 4096, a global batch of 1024 sequences
(LLaMA-2's 4M tokens), float16; each policy gets its own best plan, with the time the search took
(which may shard the training state over the replicas: the table says so).

`--skip-measured` keeps the measured part already in `--out` (with its date and arguments).

    python bench/planner.py [--profile FILE] [--budget 70MB] [--steps 12] [--rounds 3]
                            [--skip-measured] [--skip-models] [--out bench/results/planner.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

MODEL, SEQ, GLOBAL_BATCH = "tiny", 256, 8
PAPER_MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b")
POLICIES = ("ratrain", "baseline")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _train(plan: Path, run_dir: Path, steps: int) -> dict:
    proc = _cli("train", "--plan", str(plan), "--steps", str(steps), "--eval-every", "0",
                "--checkpoint-every", "0", "--no-trace", "--no-progress", "--run-dir",
                str(run_dir), cwd=run_dir.parent)
    if proc.returncode:
        raise SystemExit(proc.stderr.strip())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    at_peak = json.loads((run_dir / "summary.json").read_text())["ledger_at_peak_by_kind_per_rank"]
    before = [k["masters"] + k["gradients"] for k in at_peak]
    return {"step_time_s": statistics.median(r["step_time_s"] for r in rows[2:]),
            "ledger": rows[-1]["ledger_peak_bytes_per_rank"],
            "peak": [g + b for g, b in zip(rows[-1]["rss_growth_bytes_per_rank"], before)]}


def measured(args, work: Path) -> dict:
    profile = args.profile
    if profile is None:
        profile = str(work / "profile.yaml")
        proc = _cli("profile", "--model", MODEL, "--seq-len", str(SEQ), "--micro-batch-size", "1",
                    "--out", profile, cwd=work)
        if proc.returncode:
            raise SystemExit(proc.stderr.strip())
    plans = {}
    for policy in POLICIES:
        out = work / f"{policy}.json"
        proc = _cli("plan", "--model", MODEL, "--seq-len", str(SEQ), "--global-batch",
                    str(GLOBAL_BATCH), "--profile", profile, "--devices", "2", "--memory-budget",
                    args.budget, "--policy", policy, "--top", "1", "--out", str(out), cwd=work)
        if proc.returncode:
            raise SystemExit(proc.stderr.strip())
        print(proc.stdout, file=sys.stderr)
        plans[policy] = json.loads(out.read_text())
    runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
            runs[policy].append(_train(work / f"{policy}.json", work / f"{policy}-{r}", args.steps))
            print(f"round {r + 1}: {policy}: {runs[policy][-1]['step_time_s']:.3f} s",
                  file=sys.stderr, flush=True)
    rows = {}
    for policy in POLICIES:
        got, plan = runs[policy], plans[policy]
        rows[policy] = {
            "plan": {**plan["run"]["parallel"], "micro_batch_size": plan["run"]["train"]["micro_batch_size"],
                     "stage_choices": plan["prediction"]["stage_choices"]},
            "predicted": plan["prediction"],
            "step_time_s": statistics.median(g["step_time_s"] for g in got),
            "step_time_s_per_round": [g["step_time_s"] for g in got],
            "ledger_bytes_per_rank": got[0]["ledger"],
            "peak_bytes_per_rank": [max(g["peak"][i] for g in got) for i in range(len(got[0]["peak"]))],
        }
    speedups = [b["step_time_s"] / r["step_time_s"] for r, b in zip(runs["ratrain"], runs["baseline"])]
    return {"profile": str(profile), "budget": args.budget, "model": MODEL, "seq_len": SEQ,
            "global_batch": GLOBAL_BATCH, "steps": args.steps, "rounds": args.rounds,
            "policies": rows, "speedup_per_round": speedups,
            "speedup_median": statistics.median(speedups)}


def paper_models() -> list[dict]:
    from ratrain.models.presets import get_preset
    from ratrain.planner.account import account
    from ratrain.planner.search import PlanRequest, search
    from ratrain.sim.profile import load_profile

    out = []
    for name in PAPER_MODELS:
        row = {"model": name}
        for policy in POLICIES:
            request = PlanRequest(get_preset(name), load_profile("mt3000"), 1024, 1024, 4096,
                                  "float16", budget=20e9, policy=policy, top=1, time_limit_s=60)
            t0 = time.perf_counter()
            found = search(request)
            entry = {"seconds": time.perf_counter() - t0, "complete": found.complete,
                     "simulated": found.simulated}
            if found.best:
                c = found.best[0]
                entry.update(pp=c.layout.pp, dp=c.layout.dp, n_micro=c.layout.n_micro,
                             micro_batch_size=c.layout.micro_batch_size,
                             rank_order=c.layout.rank_order,
                             state_home=c.layout.lifecycle.state_home,
                             shard_state=c.layout.lifecycle.shard_state,
                             grad_lifetime=c.layout.lifecycle.grad_lifetime,
                             shard_group=c.layout.lifecycle.shard_group,
                             view_window=c.layout.lifecycle.view_window,
                             schedule=c.layout.schedule, weight_grad=c.layout.weight_grad,
                             partition=[b - a for a, b, _ in c.partition],
                             stage_choices=c.choices(request.model.n_layers + 2),
                             step_time_s=c.step_time, tokens_per_s=c.result.tokens_per_s,
                             bubble=c.result.bubble, max_stage_bytes=max(c.stage_bytes))
            else:
                entry["account"] = account(request)
            row[policy] = entry
            print(f"{name} {policy}: {entry.get('tokens_per_s', 'no plan')} "
                  f"({entry['seconds']:.1f} s)", file=sys.stderr, flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a profile YAML; default: measure one with `ratrain profile`")
    ap.add_argument("--budget", default="70MB")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-measured", action="store_true")
    ap.add_argument("--skip-models", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench/results/planner.json"))
    args = ap.parse_args()
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:]}
    if not args.skip_measured:
        with tempfile.TemporaryDirectory() as tmp:
            result["measured"] = measured(args, Path(tmp))
    elif Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        if "measured" in old:
            result["measured"] = old["measured"]
            result["measured_run"] = old.get("measured_run") or {
                "date": old.get("date"), "argv": old.get("argv"), "machine": old.get("machine")}
    if not args.skip_models:
        result["paper_models"] = paper_models()
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(report(result))


def report(result: dict) -> str:
    lines = []
    m = result.get("measured")
    if m:
        lines += [f"2 local ranks, {m['model']}, budget {m['budget']} per rank:", "",
                  "| policy | plan | predicted tokens/s | measured step (s) | ledger peak per rank (MB) | peak memory per rank (MB) |",
                  "|---|---|---|---|---|---|"]
        tokens = m["global_batch"] * m["seq_len"]
        for policy, row in m["policies"].items():
            p = row["plan"]
            plan = (f"pp={p['pp']} dp={p['dp']} mbs={p['micro_batch_size']}, "
                    + ", ".join(row["plan"]["stage_choices"]))
            lines.append(f"| {policy} | {plan} | {row['predicted']['tokens_per_s']:,.0f} | "
                         f"{row['step_time_s']:.3f} ({tokens / row['step_time_s']:,.0f} tokens/s) | "
                         + ", ".join(f"{b / 1e6:.1f}" for b in row["ledger_bytes_per_rank"]) + " | "
                         + ", ".join(f"{b / 1e6:.1f}" for b in row["peak_bytes_per_rank"]) + " |")
        lines.append("\nratrain over baseline, per round: "
                     + ", ".join(f"{s:.2f}x" for s in m["speedup_per_round"])
                     + f"; median {m['speedup_median']:.2f}x\n")
    if result.get("paper_models"):
        lines += ["| model | policy | plan | predicted tokens/s | step (s) | bubble | largest stage (GB) | search (s) |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in result["paper_models"]:
            for policy in POLICIES:
                e = row[policy]
                if "tokens_per_s" not in e:
                    lines.append(f"| {row['model']} | {policy} | nothing fits | - | - | - | - | {e['seconds']:.1f} |")
                    continue
                sharded = ", sharded" if e.get("shard_state") else ""
                views = ("-" if e["view_window"] is None else "resident" if e["view_window"] == 0
                         else f"window {e['view_window']}")
                schedule = " ".join(filter(None, (e.get("schedule"), e.get("weight_grad"))))
                plan = (f"pp={e['pp']} dp={e['dp']}, {e['n_micro']} x {e['micro_batch_size']}, "
                        f"{e['rank_order']}, state {e['state_home']}{sharded}, views {views}, "
                        f"{schedule}")
                lines.append(f"| {row['model']} | {policy} | {plan} | {e['tokens_per_s']:,.0f} | "
                             f"{e['step_time_s']:.1f} | {e['bubble']:.1%} | {e['max_stage_bytes'] / 1e9:.2f} | "
                             f"{e['seconds']:.1f} |")
            r, b = row["ratrain"], row["baseline"]
            if "tokens_per_s" in r and "tokens_per_s" in b:
                lines.append(f"| {row['model']} | speedup | | {r['tokens_per_s'] / b['tokens_per_s']:.2f}x | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
