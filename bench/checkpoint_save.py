"""What a checkpoint costs the training: the same run without checkpoints, with synchronous
saves (--checkpoint-sync) and with saves in the background (--checkpoint-async), in rounds (a
shared machine's drift hits all three alike).

Per save (the end-of-run save left out: nothing is left to hide it under) it reports the save's
time (the writer's, and in sync mode the training thread's: copying nothing, it writes), the
training thread's time in async mode (taking the state into host memory, and waiting for a
save still in flight at the next one), and the step times with a save in flight against those
without. `hidden` is 1 - (async's cost to the run per save) / (sync's), each cost being the run's
step-and-save time over the run without checkpoints'.

    python bench/checkpoint_save.py [--model small] [--steps 17] [--every 4] [--rounds 2]
        [--seq-len 128] [--global-batch 4] [--out bench/results/checkpoint_save.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ratrain.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

MODES = {"none": ["--no-checkpoints"], "sync": ["--checkpoint-sync"], "async": ["--checkpoint-async"]}


def run(mode: str, args, where: Path) -> dict:
    run_dir = where / mode
    cmd = [sys.executable, "-m", "ratrain.cli", "train", "--model", args.model, "--steps",
           str(args.steps), "--checkpoint-every", str(args.every), "--keep-checkpoints", "1",
           "--seq-len", str(args.seq_len), "--global-batch", str(args.global_batch),
           "--micro-batch-size", str(args.global_batch), "--eval-every", "0", "--no-trace",
           "--no-report", "--no-progress", "--json", "--run-dir", str(run_dir), *MODES[mode]]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout)
    steps = [r["step_time_s"] for r in read_metrics(run_dir / "metrics.jsonl")]
    saves = [s for s in summary.get("checkpoint_saves", []) if s["step"] < args.steps]
    return {"steps": steps, "saves": saves}


def costs(result: dict, mode: str) -> dict:
    """Per save (the end-of-run one left out): the training thread's time, the save's, and the
    step times with the save in flight (the steps after it until its writer's time is spent)."""
    steps, saves = result["steps"], result["saves"]
    out = {"step_s": steps[1:], "loop_s": sum(steps[1:])}  # the first step pays for warm-up
    if not saves:
        return out
    if mode == "sync":  # the training thread wrote the files: taking the state is the save
        out["save_s"] = [s["taken_s"] + s["written_s"] for s in saves]
        out["blocked_s"] = out["save_s"]
    else:
        out["save_s"] = [s["written_s"] for s in saves]
        out["blocked_s"] = [s["taken_s"] + s["waited_s"] for s in saves]
        during = set()
        for s in saves:
            left, i = s["written_s"], s["step"]  # steps[i] is step i + 1, the first after the save
            while left > 0 and i < len(steps):
                during.add(i)
                left -= steps[i]
                i += 1
        out["step_s_in_flight"] = [steps[i] for i in sorted(during)]
        out["step_s_otherwise"] = [t for i, t in enumerate(steps) if i and i not in during]
    out["loop_s"] += sum(out["blocked_s"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small")
    p.add_argument("--steps", type=int, default=17)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="ratrain-ckpt-bench-") as tmp:
        for r in range(args.rounds):
            rounds.append({mode: costs(run(mode, args, Path(tmp) / f"r{r}"), mode) for mode in MODES})
    report = {"settings": vars(args) | {"out": str(args.out) if args.out else None},
              "machine": machine(), "rounds": rounds}
    lines = []
    for r, row in enumerate(rounds):
        n = len(row["sync"]["save_s"])
        cost = {m: (row[m]["loop_s"] - row["none"]["loop_s"]) / n for m in ("sync", "async")}
        row["cost_per_save_s"] = cost
        row["hidden"] = 1 - cost["async"] / cost["sync"]
        a = row["async"]
        lines.append(
            f"round {r}: save {statistics.median(row['sync']['save_s']):.2f} s sync, "
            f"{statistics.median(a['save_s']):.2f} s async (writer); async blocks training "
            f"{statistics.median(a['blocked_s']):.3f} s a save; step "
            f"{statistics.median(a['step_s_in_flight']):.3f} s with a save in flight, "
            f"{statistics.median(a['step_s_otherwise']):.3f} s without, "
            f"{statistics.median(row['none']['step_s']):.3f} s with no checkpoints; cost per "
            f"save {cost['sync']:.2f} s sync, {cost['async']:.2f} s async: {row['hidden']:.0%} hidden")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
