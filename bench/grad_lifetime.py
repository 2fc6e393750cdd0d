"""Gradient lifetimes measured on this machine: what each costs in memory, and a plan with a
shorter one run under a budget that plans whose gradients live the step cannot meet.

Part 1, memory: `ratrain train --model MODEL --dp 4 --shard-state --view-window 1
--grad-lifetime L` for L in step, transient, micro-batch (1F1B, one micro-batch of one sequence
per replica), each with glibc's default allocator and with MALLOC_MMAP_THRESHOLD_ fixed at
4 MiB (allocations of 4 MiB and more are mapped and unmapped on their own: freed memory leaves
the process at once, so the resident set follows what is alive; by default glibc raises the
threshold to the size of the largest buffer freed, and the freed buffers stay in the process). Per run and rank: the ledger's
peak, the process's peak RSS (ru_maxrss), and the tokens/s of the steps after the first.

Part 2, planned runs: with a profile from `ratrain profile` (or `--profile FILE`), `ratrain
plan --devices D --memory-budget B [--pp P]` with every lifetime, and with `--grad-lifetime step`
(the search as it was before the lifetimes; where nothing fits, its account is kept). Each plan found
is trained (`ratrain train --plan`) `--rounds` times with each allocator, interleaved. Measured:
the median step time after the first two steps against the prediction, and per rank the peak
memory the budget is about (the ledger's bytes before training plus the RSS growth during it)
against the budget.

    python bench/grad_lifetime.py [--model small] [--steps 6] [--rounds 2] [--profile FILE]
        [--devices 4] [--budget 280MB] [--pp 1] [--skip-memory] [--skip-planned]
        [--out bench/results/grad_lifetime.json]
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

from ratrain.training.metrics import read_metrics
from ratrain.planner.budget import parse_bytes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

LIFETIMES = ("step", "transient", "micro-batch")
# the search with every lifetime, and as it was before them (`ratrain plan --grad-lifetime step`)
PLANS = {"every lifetime": [], "step only": ["--grad-lifetime", "step"]}
ALLOCATORS = {"glibc default": {}, "mmap threshold 4 MiB": {"MALLOC_MMAP_THRESHOLD_": "4194304"}}
SEQ = 256
MIB = 2**20


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *args], cwd=cwd, text=True,
                          capture_output=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def train(args: list[str], run_dir: Path, env: dict) -> dict:
    """One run: its step times, and per rank the ledger's peak, the ledger's bytes before
    training, the RSS growth and the peak RSS."""
    proc = cli("train", *args, "--eval-every", "0", "--checkpoint-every", "0", "--no-trace",
               "--no-progress", "--run-dir", str(run_dir), cwd=run_dir.parent, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr.strip())
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    last = rows[-1]
    before = summary["ledger_before_training_bytes_per_rank"]
    return {"step_time_s": statistics.median(r["step_time_s"] for r in rows[2:] or rows[1:]),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows[1:]),
            "final_loss": last["loss"],
            "ledger_peak": last["ledger_peak_bytes_per_rank"],
            "ledger_before_training": before,
            "rss_growth": last["rss_growth_bytes_per_rank"],
            "peak_rss": last["peak_memory_bytes_per_rank"],
            "peak": [b + g for b, g in zip(before, last["rss_growth_bytes_per_rank"])]}


def memory(args, work: Path) -> dict:
    out = {}
    for r in range(args.rounds):
        for name, env in ALLOCATORS.items():
            for lifetime in LIFETIMES if r % 2 == 0 else LIFETIMES[::-1]:
                run = train(["--model", args.model, "--dp", "4", "--shard-state", "--view-window",
                             "1", "--grad-lifetime", lifetime, "--schedule", "1f1b",
                             "--steps", str(args.steps), "--global-batch", "4",
                             "--micro-batch-size", "1", "--seq-len", str(SEQ)],
                            work / f"memory-{r}-{lifetime}-{len(env)}", env)
                out.setdefault(name, {}).setdefault(lifetime, []).append(run)
                print(f"round {r + 1}, {name}, {lifetime}: ledger {run['ledger_peak'][0] / MIB:.0f} "
                      f"MiB, peak RSS {[round(b / MIB) for b in run['peak_rss']]} MiB, "
                      f"{run['tokens_per_s']:.0f} tokens/s", file=sys.stderr, flush=True)
    return out


def planned(args, work: Path) -> dict:
    profile = args.profile
    if profile is None:  # kept beside the results: the predictions are made on it
        profile = str(ROOT / "bench/results" / f"profile_{args.model}_{time.strftime('%Y-%m-%d')}.yaml")
        proc = cli("profile", "--model", args.model, "--seq-len", str(SEQ), "--micro-batch-size",
                   "1", "--out", profile, cwd=work)
        if proc.returncode:
            raise SystemExit(proc.stderr.strip())
    search = ["plan", "--model", args.model, "--seq-len", str(SEQ), "--global-batch",
              str(args.global_batch), "--profile", profile, "--devices", str(args.devices),
              "--memory-budget", args.budget, "--top", "1",
              *(["--pp", str(args.pp)] if args.pp else [])]
    plans, accounts = {}, {}
    for name, restrict in PLANS.items():
        path = work / f"plan-{name}.json"
        found = cli(*search, *restrict, "--out", str(path), cwd=work)
        if found.returncode == 2:  # nothing fits: the account says why
            accounts[name] = found.stderr.strip()
            continue
        if found.returncode:
            raise SystemExit(found.stderr.strip())
        print(found.stdout, file=sys.stderr)
        plans[name] = path
    if "every lifetime" not in plans:
        raise SystemExit(accounts["every lifetime"])
    runs: dict[str, dict[str, list[dict]]] = {}
    for r in range(args.rounds):
        for name, path in plans.items() if r % 2 == 0 else list(plans.items())[::-1]:
            for allocator, env in ALLOCATORS.items():
                run = train(["--plan", str(path), "--steps", str(args.steps)],
                            work / f"planned-{r}-{len(env)}-{len(name)}", env)
                runs.setdefault(name, {}).setdefault(allocator, []).append(run)
                print(f"round {r + 1}, {name}, {allocator}: {run['step_time_s']:.3f} s, peak "
                      f"{[round(b / 1e6, 1) for b in run['peak']]} MB", file=sys.stderr, flush=True)
    out = {"profile": profile, "budget": args.budget, "devices": args.devices, "pp": args.pp,
           "global_batch": args.global_batch, "accounts": accounts, "plans": {}}
    for name, path in plans.items():
        plan = json.loads(path.read_text())
        out["plans"][name] = {
            "plan": {**plan["run"]["parallel"],
                     "micro_batch_size": plan["run"]["train"]["micro_batch_size"],
                     "stage_choices": plan["prediction"]["stage_choices"]},
            "predicted": plan["prediction"], "runs": runs[name]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", help="a profile YAML; default: measure one with `ratrain profile`")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--budget", default="280MB")
    ap.add_argument("--pp", type=int, default=1,
                    help="restrict both searches to this many stages (0: the planner's choice)")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-planned", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench/results/grad_lifetime.json"))
    args = ap.parse_args()
    if args.profile:  # (the runs start in a temporary directory)
        args.profile = str(Path(args.profile).resolve())
    result = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "argv": sys.argv[1:], "model": args.model, "seq_len": SEQ, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_memory:
            result["memory"] = memory(args, Path(tmp))
            Path(args.out).write_text(json.dumps(result, indent=2))  # kept if part 2 fails
        if not args.skip_planned:
            result["planned"] = planned(args, Path(tmp))
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(report(result))


def report(result: dict) -> str:
    lines = []
    if "memory" in result:
        lines += [f"{result['model']}, dp=4, sharded, views window 1, 1F1B, one micro-batch of "
                  f"1 x {result['seq_len']} per replica; medians over rounds", "",
                  "| allocator | lifetime | ledger peak (MiB) | peak RSS per rank (MiB) | "
                  "fall from step: ledger / RSS (MiB) | tokens/s |", "|---|---|---|---|---|---|"]
        for name, by_lifetime in result["memory"].items():
            base = _medians(by_lifetime["step"])
            for lifetime, runs in by_lifetime.items():
                m = _medians(runs)
                lines.append(
                    f"| {name} | {lifetime} | {m['ledger'] / MIB:.0f} | "
                    + ", ".join(f"{b / MIB:.0f}" for b in m["rss"]) + " | "
                    + f"{(base['ledger'] - m['ledger']) / MIB:.0f} / "
                    + f"{(max(base['rss']) - max(m['rss'])) / MIB:.0f} | {m['tokens_per_s']:.0f} |")
    if "planned" in result:
        p = result["planned"]
        budget = parse_bytes(p["budget"])
        stages = f", pipeline stages fixed at {p['pp']}" if p.get("pp") else ""
        lines += ["", f"budget {p['budget']} per device, {p['devices']} devices, global batch "
                  f"{p['global_batch']}{stages}", "",
                  "| search | plan | predicted step (s) | predicted stage peaks (MB) | allocator | "
                  "measured step (s), per round | error | peak per rank (MB), largest over rounds "
                  "| within the budget |", "|---|---|---|---|---|---|---|---|---|"]
        for name, entry in p["plans"].items():
            plan, pred = entry["plan"], entry["predicted"]
            what = (f"pp={plan['pp']} dp={plan['dp']}, micro-batch {plan['micro_batch_size']}, "
                    + (f"sharded, grad {plan['grad_lifetime']}, " if plan["shard_state"] else "")
                    + f"views window {plan['view_window']}, " + ", ".join(plan["stage_choices"]))
            for allocator, runs in entry["runs"].items():
                step = statistics.median(r["step_time_s"] for r in runs)
                peak = [max(r["peak"][i] for r in runs) for i in range(len(runs[0]["peak"]))]
                lines.append(
                    f"| {name} | {what} | {pred['step_time_s']:.3f} | "
                    + ", ".join(f"{b / 1e6:.1f}" for b in pred["stage_peak_bytes"])
                    + f" | {allocator} | " + ", ".join(f"{r['step_time_s']:.3f}" for r in runs)
                    + f" | {step / pred['step_time_s'] - 1:+.1%} | "
                    + ", ".join(f"{b / 1e6:.1f}" for b in peak)
                    + f" | {'yes' if max(peak) <= budget else 'NO'} |")
        for name, text in p["accounts"].items():
            lines.append(f"\n{name}: {text.splitlines()[0]}")
    return "\n".join(lines)


def _medians(runs: list[dict]) -> dict:
    ranks = range(len(runs[0]["peak_rss"]))
    return {"ledger": statistics.median(r["ledger_peak"][0] for r in runs),
            "rss": [statistics.median(r["peak_rss"][i] for r in runs) for i in ranks],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs)}


if __name__ == "__main__":
    main()
