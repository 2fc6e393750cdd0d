"""Long correctness run: the `ratrain` policy's losses against the `baseline` policy's and a
single process's, step by step, in fp32.

Three `ratrain train` runs, one after the other, each in its own processes (gloo, 1 thread per
rank), with the same model, seed, built-in corpus (Python's standard library, byte tokenizer),
global batch, sequence length, micro-batch size, learning-rate schedule and clipping:

* ratrain:  pp=2 dp=2, `--policy ratrain`, per-stage activation recovery (default: stage 0
  recomputes its blocks, stage 1 keeps them);
* baseline: the same layout with `--policy baseline` (GPU-style: every gradient sync and update
  after the pipeline flush, one activation policy for every block, default recompute: the
  baseline refuses per-stage choices), the semantically equivalent 1F1B run;
* single:   pp=1 dp=1, one process, the same global batch in micro-batches of the same size.

Measured: each run's per-step training loss (metrics.jsonl), and the relative deviation
|loss_ratrain - loss_other| / |loss_other| at every step; reported: its maximum over the run
(and the step where it occurs), the same for the mean loss over windows of `--window` steps,
the tokens trained, and each run's wall time and median step time, with the number of steps
that would fit in `--budget-s` seconds at those rates. The target (issue 18): at most 1e-5 over
at least 2,000 steps.

ratrain and baseline run the same arithmetic in a different order of syncs and updates, so
they can agree exactly. The single process sums its micro-batches' gradients in another order
than two replicas' averaged sums, so it starts within float32 rounding of the others and that
difference can grow with training.

    python bench/correctness.py [--steps 2400] [--seq-len 32] [--global-batch 4]
                                [--micro-batch-size 1] [--activation recompute,keep]
                                [--baseline-activation recompute]
                                [--work DIR] [--out bench/results/correctness.json]
                                [--plot docs/correctness.png]

With --out elsewhere the plot goes beside it (its name, .png) unless --plot says where: a smoke
run with --out in /tmp leaves the committed result and figure alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratrain.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from outputs import draw, outputs, write_results  # noqa: E402
from peers import machine  # noqa: E402

TARGET = 1e-5
# From 30-step smoke runs on the 2-core development VM (docs/correctness.md): with two other
# sessions loading it (load average 4) the three runs' step times and start-ups fit about 1,900
# steps in 15 minutes; the same runs' steps were about 25% faster at lower load, which fits this.
DEFAULT_STEPS = 2400


def runs(args) -> dict[str, list[str]]:
    common = ["--model", args.model, "--seed", str(args.seed), "--seq-len", str(args.seq_len),
              "--global-batch", str(args.global_batch), "--micro-batch-size",
              str(args.micro_batch_size), "--dtype", "float32", "--steps", str(args.steps),
              "--threads", "1"]
    pipeline = ["--pp", "2", "--dp", "2", "--schedule", "1f1b"]  # the run docs/correctness.md records
    # Recompute and keep compute the same values (docs/benchmarks.md, memory: bit-identical
    # losses), so the baseline's uniform choice leaves the arithmetic as ratrain's.
    return {"ratrain": [*common, *pipeline, "--activation", args.activation, "--policy", "ratrain"],
            "baseline": [*common, *pipeline, "--activation", args.baseline_activation,
                         "--policy", "baseline"],
            "single": [*common, "--pp", "1", "--dp", "1"]}


def train(name: str, flags: list[str], work: Path) -> dict:
    run_dir = work / name
    cmd = [sys.executable, "-m", "ratrain.cli", "train", *flags, "--run-dir", str(run_dir),
           "--eval-every", "0", "--checkpoint-every", "0", "--no-trace", "--no-progress",
           "--no-report"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{name}: `{' '.join(cmd[1:])}` failed:\n{proc.stderr.strip()}")
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [r["step_time_s"] for r in rows]
    return {"command": "python -m ratrain.cli train " + " ".join(flags), "wall_s": wall,
            "steps": len(rows), "median_step_s": statistics.median(steps[1:] or steps),
            "startup_s": max(0.0, wall - sum(steps)),
            "loss": [r["loss"] for r in rows]}


def deviation(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) / abs(y) for x, y in zip(a, b)]


def window_means(loss: list[float], window: int) -> list[float]:
    """Mean loss of consecutive windows of steps: a curve's level without its step-to-step
    noise, where two runs that drifted apart by rounding still agree or do not."""
    return [statistics.fmean(loss[i:i + window]) for i in range(0, len(loss), window)]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    styles = {"ratrain": ("tab:blue", "-", 1.6), "baseline": ("tab:orange", "--", 1.2),
              "single": ("tab:green", ":", 1.2)}
    for name, run in result["runs"].items():
        color, style, width = styles[name]
        steps = range(1, len(run["loss"]) + 1)
        top.plot(steps, run["loss"], style, color=color, linewidth=width,
                 label=f"{name}: {run['layout']}")
    top.set_ylabel("training loss")
    top.set_yscale("log")
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=8)
    s = result["settings"]
    top.set_title(f"{s['model']}, fp32, seq {s['seq_len']}, global batch {s['global_batch']}, "
                  f"{s['steps']} steps ({result['tokens_trained']:,} tokens per run)")
    floor = 1e-12  # exact agreement (0) drawn here, as log axes cannot show 0
    for other, color in (("baseline", "tab:orange"), ("single", "tab:green")):
        dev = result["deviation"][other]["per_step"]
        exact = all(d == 0 for d in dev)
        steps = range(1, len(dev) + 1)
        bottom.plot(steps, [max(d, floor) for d in dev], color=color, linewidth=0.8,
                    label=f"ratrain vs {other}: max {max(dev):.2e}"
                          + (" (identical at every step)" if exact else ""))
    bottom.axhline(TARGET, color="red", linewidth=0.8, linestyle="--", label="target 1e-5")
    bottom.set_yscale("log")
    bottom.set_ylim(floor / 2, None)
    bottom.set_xlabel("step")
    bottom.set_ylabel("relative loss deviation (0 drawn at 1e-12)")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(result: dict) -> str:
    s = result["settings"]
    lines = [f"{s['model']}, fp32, seq {s['seq_len']}, global batch {s['global_batch']} in "
             f"micro-batches of {s['micro_batch_size']}, {s['steps']} steps, "
             f"{result['tokens_trained']:,} tokens per run", "",
             "| run | layout | final loss | wall (s) | median step (s) |", "|---|---|---|---|---|"]
    for name, run in result["runs"].items():
        lines.append(f"| {name} | {run['layout']} | {run['loss'][-1]:.6f} | {run['wall_s']:.1f} | "
                     f"{run['median_step_s']:.3f} |")
    lines.append("")
    for other, d in result["deviation"].items():
        verdict = "within" if d["max"] <= TARGET else "ABOVE"
        lines.append(f"ratrain vs {other}: max relative loss deviation {d['max']:.3e} at step "
                     f"{d['at_step']} ({verdict} the 1e-5 target); steps identical: "
                     f"{d['identical_steps']} of {len(d['per_step'])}; of the mean loss over "
                     f"windows of {d['window']} steps: {d['max_of_window_means']:.3e}")
    lines.append(f"\nat these rates, {result['steps_in_budget']} steps fit in "
                 f"{result['budget_s']:.0f} s (all three runs, start-up included)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--activation", default="recompute,keep",
                    help="ratrain's activation recovery, per pipeline stage")
    ap.add_argument("--baseline-activation", default="recompute",
                    help="the baseline's, one for every block (keep or recompute)")
    ap.add_argument("--window", type=int, default=100,
                    help="steps per window of the windowed mean-loss deviation")
    ap.add_argument("--budget-s", type=float, default=900.0,
                    help="the wall time the step estimate is made for")
    ap.add_argument("--work", help="keep the run directories here (default: a temporary one)")
    ap.add_argument("--out", help="the JSON [default: bench/results/correctness.json]")
    ap.add_argument("--plot", help="'' for none [default: beside --out, as .png; "
                                   "docs/correctness.png for the default --out]")
    args = ap.parse_args()
    out, png = outputs(args.out, args.plot, ROOT / "bench/results/correctness.json",
                       ROOT / "docs/correctness.png")
    layouts = {"ratrain": f"pp=2 dp=2, policy ratrain, activation {args.activation}",
               "baseline": f"pp=2 dp=2, policy baseline, activation {args.baseline_activation}",
               "single": "pp=1 dp=1, one process"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = {}
        for name, flags in runs(args).items():
            results[name] = {"layout": layouts[name], **train(name, flags, work)}
            r = results[name]
            print(f"{name}: {r['steps']} steps in {r['wall_s']:.1f} s, median step "
                  f"{r['median_step_s']:.3f} s, final loss {r['loss'][-1]:.6f}",
                  file=sys.stderr, flush=True)
    ref = results["ratrain"]["loss"]
    dev = {}
    for other in ("baseline", "single"):
        per_step = deviation(ref, results[other]["loss"])
        worst = max(range(len(per_step)), key=per_step.__getitem__)
        windowed = deviation(window_means(ref, args.window),
                             window_means(results[other]["loss"], args.window))
        dev[other] = {"max": per_step[worst], "at_step": worst + 1,
                      "identical_steps": sum(1 for d in per_step if d == 0),
                      "within_target": per_step[worst] <= TARGET,
                      "max_of_window_means": max(windowed), "window": args.window,
                      "per_step": per_step}
    per_step_all = sum(r["median_step_s"] for r in results.values())
    startup = sum(r["startup_s"] for r in results.values())
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv[1:], "machine": machine(),
        "settings": {"model": args.model, "seed": args.seed, "seq_len": args.seq_len,
                     "global_batch": args.global_batch, "micro_batch_size": args.micro_batch_size,
                     "activation": args.activation,
                     "baseline_activation": args.baseline_activation,
                     "steps": args.steps, "dtype": "float32",
                     "data": "built-in corpus (Python's standard library), byte tokenizer"},
        "tokens_trained": args.steps * args.global_batch * args.seq_len,
        "target": TARGET, "runs": results, "deviation": dev, "budget_s": args.budget_s,
        "steps_in_budget": int(max(0.0, args.budget_s - startup) / per_step_all),
    }
    write_results(out, result)
    draw(plot, result, png)
    print(report(result))


if __name__ == "__main__":
    main()
