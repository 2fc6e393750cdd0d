"""Memory of the lifecycle's choices: peak bytes per pipeline stage and tokens/s, side by side.

For each layout (pp=2 on `tiny`, pp=4 on `small`, 8 blocks) every memory choice trains the same
model on the same data as its own `ratrain train --plan FILE` run (the CLI a user runs, with its
own processes); the runs of all choices alternate in rounds, so a shared machine's drift hits all
alike. Each run reports, per rank, the executor's memory ledger peak (the bytes it held, by
kind) and the process's peak RSS growth over its size before the first step (both from
metrics.jsonl), and tokens/s (median over the steps after the first).

Choices: activation recovery (`keep`, `recompute`, per-stage `recompute,keep`-like mixes,
`offload`) and parameter views (window 0: resident fp32 copies of the masters; window 1 and 2:
made one or two units ahead of use and released after). On a CPU-only run the host tier is the
same memory, so offload and views cannot lower the measured peak here: they show their cost and
their bookkeeping; the ledger says where the bytes would live. This is the data the planner's
memory model will be judged against.

    python bench/memory.py [--layouts 2,4] [--steps 6] [--rounds 2] [--out bench/results/memory.json]
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

from ratrain.config import RunConfig
from ratrain.training.metrics import read_metrics
from ratrain.models.presets import get_preset
from ratrain.schedule.plan import build_plan

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

# layout -> (model preset, [(label, policy, activation per stage, view window)])
LAYOUTS = {
    2: ("tiny", [
        ("keep", "ratrain", ["keep", "keep"], None),
        ("recompute", "ratrain", ["recompute", "recompute"], None),
        ("recompute,keep", "ratrain", ["recompute", "keep"], None),
        ("offload", "ratrain", ["offload", "offload"], None),
        ("offload,keep", "ratrain", ["offload", "keep"], None),
        ("keep, views w0", "ratrain", ["keep", "keep"], 0),
        ("keep, views w1", "ratrain", ["keep", "keep"], 1),
        ("keep, views w2", "ratrain", ["keep", "keep"], 2),
        ("baseline keep", "baseline", ["keep", "keep"], None),
    ]),
    4: ("small", [
        ("keep", "ratrain", ["keep"] * 4, None),
        ("recompute", "ratrain", ["recompute"] * 4, None),
        ("recompute x2,keep x2", "ratrain", ["recompute", "recompute", "keep", "keep"], None),
        ("offload", "ratrain", ["offload"] * 4, None),
        ("keep, views w1", "ratrain", ["keep"] * 4, 1),
    ]),
}


def _config(preset: str, pp: int, args) -> RunConfig:
    cfg = RunConfig(model=get_preset(preset))
    t = cfg.train
    t.seq_len, t.global_batch, t.micro_batch_size = args.seq_len, args.global_batch, args.micro_batch_size
    t.steps, t.eval_batches, t.checkpoint_every, t.warmup_steps = args.steps, 0, 0, 0
    cfg.parallel.pp = pp
    return cfg


def _run(cfg: RunConfig, choice, work: Path) -> dict:
    label, policy, activation, window = choice
    plan = build_plan(cfg.model.n_layers, cfg.parallel.pp, 1, cfg.n_micro, policy=policy,
                      activation=activation, view_window=window,
                      clip=cfg.train.grad_clip > 0)
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.save(work / "config.yaml")
    run_dir = work / f"run-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "ratrain.cli", "train", "--config", str(work / "config.yaml"),
           "--plan", str(work / "plan.json"), "--run-dir", str(run_dir), "--no-progress",
           "--no-trace"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    if proc.returncode:
        raise SystemExit(f"{label}: {proc.stderr.strip()}")
    rows = read_metrics(run_dir / "metrics.jsonl")
    last = rows[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows[1:]),
            "ledger": last["ledger_peak_bytes_per_rank"],
            "by_kind": summary["ledger_at_peak_by_kind_per_rank"],
            "rss_growth": last.get("rss_growth_bytes_per_rank"),
            "losses": [r["loss"] for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="2,4", help="pipeline degrees to run (2: tiny, 4: small)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/memory.json"))
    args = ap.parse_args()
    results = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:],
               "layouts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for pp in map(int, args.layouts.split(",")):
            preset, choices = LAYOUTS[pp]
            cfg = _config(preset, pp, args)
            runs = {c[0]: [] for c in choices}
            for r in range(args.rounds):
                order = choices if r % 2 == 0 else choices[::-1]
                for choice in order:
                    runs[choice[0]].append(_run(_config(preset, pp, args), choice, Path(tmp) / str(pp)))
                    print(f"pp={pp} round {r + 1}: {choice[0]} done", file=sys.stderr, flush=True)
            summaries = {label: _summary(rs) for label, rs in runs.items()}
            keep_losses = runs["keep"][0]["losses"]
            for label, rs in runs.items():  # every choice computes the same run
                summaries[label]["max_loss_diff_vs_keep"] = max(
                    abs(a - b) / b for a, b in zip(rs[0]["losses"], keep_losses))
            results["layouts"][str(pp)] = {
                "model": preset, "n_micro": cfg.n_micro, "seq_len": args.seq_len,
                "micro_batch_size": args.micro_batch_size, "choices": summaries,
            }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(table(results))


def _summary(rounds: list[dict]) -> dict:
    """Per stage: the ledger peak (the same in every round: the bookkeeping is deterministic),
    the median RSS growth; tokens/s: median over rounds."""
    pp = len(rounds[0]["ledger"])
    rss = [statistics.median(r["rss_growth"][s] for r in rounds) for s in range(pp)] \
        if rounds[0]["rss_growth"] else None
    return {"ledger": rounds[0]["ledger"], "by_kind": rounds[0]["by_kind"],
            "ledger_stable": all(r["ledger"] == rounds[0]["ledger"] for r in rounds),
            "rss_growth": rss, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rounds),
            "losses_equal": all(r["losses"] == rounds[0]["losses"] for r in rounds)}


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def table(results: dict) -> str:
    """One row per choice and stage: the ledger's peak and, at that peak, the bytes of
    activations on the device, offloaded ones and views; the measured RSS growth; tokens/s."""
    lines = []
    for pp, layout in results["layouts"].items():
        choices = layout["choices"]
        keep = choices["keep"]["tokens_per_s"]
        lines.append(f"\npp={pp}, {layout['model']}, {layout['n_micro']} micro-batches of "
                     f"{layout['micro_batch_size']} x {layout['seq_len']} tokens (MiB)")
        head = ["choice", "stage", "ledger peak", "activations", "offloaded", "views",
                "RSS growth", "tokens/s", "vs keep"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for label, c in choices.items():
            rss = c["rss_growth"] or [None] * int(pp)
            for s, (peak, kinds, grown) in enumerate(zip(c["ledger"], c["by_kind"], rss)):
                rate = [f"{c['tokens_per_s']:.0f}", f"{c['tokens_per_s'] / keep:.3f}"] if s == 0 else ["", ""]
                cells = [label if s == 0 else "", str(s), _mib(peak), _mib(kinds["activations"]),
                         _mib(kinds["offloaded"]), _mib(kinds["views"]), _mib(grown), *rate]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
