"""What a checkpoint costs the training: the same run without checkpoints, with synchronous
saves (--checkpoint-sync) and with saves in the background (--checkpoint-async), in rounds (a
shared machine's drift hits all three alike).

Per save (the end-of-run save left out: nothing is left to hide it under) it reports the save's
time (the writer's, and in sync mode the training thread's: copying nothing, it writes), the
training thread's time in async mode (taking the state into host memory, and waiting for a
save still in flight at the next one), and the step times with a save in flight against those
without. `hidden` is 1 - (async's cost to the run per save) / (sync's), each cost being the run's
step-and-save time over the run without checkpoints'. Where the round has no sync run, the
async run alone gives `hidden_in_run`: 1 - (its blocked time plus what the steps with a save in
flight took beyond the median of the others) / the writer's time.

`--resume-check` then resumes the first round's async run from its mid-run checkpoint (the
end-of-run one removed) with checkpoints off and compares each step's loss after it with the
uninterrupted run's. The GPU case (scripts/gpu_check.sh's `ckpt`): a model file (`--config`)
and the run's own flags (`--train-args`), in a directory on the disk being measured (`--dir`).

    python bench/checkpoint_save.py [--model small | --config FILE] [--steps 17] [--every 4]
        [--rounds 2] [--seq-len 128] [--global-batch 4] [--modes none,sync,async]
        [--train-args "--dtype bfloat16"] [--resume-check] [--dir DIR]
        [--out bench/results/checkpoint_save.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
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


def train(args, run_dir: Path, *flags: str, resume: bool = False) -> dict:
    """`ratrain train` with the bench's settings and `flags` (resuming: the run's own model and
    shape); its summary (stderr shown on failure)."""
    model = ["--config", str(args.config)] if args.config else ["--model", args.model]
    shape = [f for name, value in (("--seq-len", args.seq_len), ("--global-batch", args.global_batch))
             if value is not None for f in (name, str(value))]
    if args.global_batch is not None:
        shape += ["--micro-batch-size", str(args.global_batch)]
    start = ["--resume", str(run_dir)] if resume else [*model, *shape, "--run-dir", str(run_dir)]
    cmd = [sys.executable, "-m", "ratrain.cli", "train", *start, "--steps", str(args.steps),
           "--eval-every", "0", "--no-trace", "--no-report", "--no-progress", "--json",
           *shlex.split(args.train_args), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def run(mode: str, args, where: Path) -> dict:
    run_dir = where / mode
    # keep 2: the mid-run checkpoints and the end's, so the resume check has the last mid-run one
    summary = train(args, run_dir, "--checkpoint-every", str(args.every), "--keep-checkpoints",
                    "2", *MODES[mode])
    steps = [r["step_time_s"] for r in read_metrics(run_dir / "metrics.jsonl")]
    saves = [s for s in summary.get("checkpoint_saves", []) if s["step"] < args.steps]
    return {"steps": steps, "saves": saves, "run_dir": run_dir}


def resume_check(args, run_dir: Path) -> dict:
    """Resume `run_dir` from its newest mid-run checkpoint and compare the losses after it."""
    before = {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")}
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    if len(ckpts) < 2:
        sys.exit(f"--resume-check needs a mid-run checkpoint in {run_dir}: --every below --steps")
    shutil.rmtree(ckpts[-1])
    resumed_from = int(ckpts[-2].name.split("_")[1])
    train(args, run_dir, "--no-checkpoints", resume=True)
    after = {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")}
    steps = [s for s in sorted(after) if s > resumed_from]
    diffs = [abs(after[s] - before[s]) for s in steps]
    return {"resumed_from": resumed_from, "steps": steps, "losses": [after[s] for s in steps],
            "uninterrupted": [before[s] for s in steps], "max_abs_diff": max(diffs),
            "bitwise": all(after[s] == before[s] for s in steps)}


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
        usual = statistics.median(out["step_s_otherwise"] or out["step_s_in_flight"])
        slower = max(0.0, sum(t - usual for t in out["step_s_in_flight"]))  # (not below noise)
        cost = sum(out["blocked_s"]) + slower
        out["hidden_in_run"] = 1 - cost / sum(out["save_s"])
    out["loop_s"] += sum(out["blocked_s"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small")
    p.add_argument("--config", type=Path, help="a run config (its model) instead of --model")
    p.add_argument("--steps", type=int, default=17)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq-len", type=int, help="default: 128, or the config's")
    p.add_argument("--global-batch", type=int, help="default: 4, or the config's")
    p.add_argument("--modes", default=",".join(MODES), help="of none, sync, async")
    p.add_argument("--train-args", default="", help="more `ratrain train` flags, one string")
    p.add_argument("--resume-check", action="store_true")
    p.add_argument("--dir", type=Path, help="where the runs go (default: a temporary directory)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not args.config:
        args.seq_len = args.seq_len or 128
        args.global_batch = args.global_batch or 4
    modes = args.modes.split(",")
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes takes some of {', '.join(MODES)}, got {args.modes!r}")
    if args.resume_check and "async" not in modes:
        p.error("--resume-check resumes the async run: add async to --modes")
    if args.dir:  # scripts/gpu_check.sh's CKPT_DIR may be a disk's mount with no folder yet
        args.dir.mkdir(parents=True, exist_ok=True)
    rounds, resumed = [], None
    with tempfile.TemporaryDirectory(prefix="ratrain-ckpt-bench-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            row = {}
            for mode in modes:  # one run's checkpoints on the disk at a time
                result = run(mode, args, Path(tmp) / f"r{r}")
                if args.resume_check and r == 0 and mode == "async":
                    resumed = resume_check(args, result["run_dir"])
                row[mode] = costs(result, mode)
                shutil.rmtree(result["run_dir"])
            rounds.append(row)
    report = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "machine": machine(), "rounds": rounds, "resume_check": resumed}
    lines = [round_line(r, row) for r, row in enumerate(rounds)]
    if resumed:
        lines.append(f"resumed from step {resumed['resumed_from']}: losses of steps "
                     f"{resumed['steps'][0]}-{resumed['steps'][-1]} "
                     f"{'bit for bit' if resumed['bitwise'] else 'not bit for bit'} the "
                     f"uninterrupted run's (largest difference {resumed['max_abs_diff']:.3g})")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


def round_line(r: int, row: dict) -> str:
    """One round's summary; the cost per save and `hidden` where it has the three runs."""
    parts = [f"round {r}:"]
    if "sync" in row and row["sync"]["save_s"]:
        parts.append(f"save {statistics.median(row['sync']['save_s']):.2f} s sync;")
    a = row.get("async")
    if a and a.get("save_s"):
        parts.append(
            f"{statistics.median(a['save_s']):.2f} s async (writer), blocking training "
            f"{statistics.median(a['blocked_s']):.3f} s a save; step "
            f"{statistics.median(a['step_s_in_flight']):.3f} s with a save in flight, "
            f"{statistics.median(a['step_s_otherwise'] or [float('nan')]):.3f} s without: "
            f"{a['hidden_in_run']:.0%} of the writer's time hidden in the run;")
    if "none" in row:
        parts.append(f"step {statistics.median(row['none']['step_s']):.3f} s with no checkpoints;")
    if {"none", "sync", "async"} <= row.keys() and row["sync"]["save_s"]:
        n = len(row["sync"]["save_s"])
        cost = {m: (row[m]["loop_s"] - row["none"]["loop_s"]) / n for m in ("sync", "async")}
        row["cost_per_save_s"] = cost
        row["hidden"] = 1 - cost["async"] / cost["sync"]
        parts.append(f"cost per save {cost['sync']:.2f} s sync, {cost['async']:.2f} s async: "
                     f"{row['hidden']:.0%} hidden")
    return " ".join(parts)


if __name__ == "__main__":
    main()
