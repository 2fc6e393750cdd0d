"""FSDP2 against ratrain's sharded state: tokens/s, peak RSS and losses, one pipeline stage.

At each data-parallel degree (`--dps`, default 2 and 4; gloo, one thread per rank, this machine)
every row trains the same model from the same initial weights (`build_units(model, seed)`) on the
same batches (ratrain's loader over the built-in corpus) with the same AdamW, learning-rate
schedule and clipping, in fp32, for `--steps` steps, in its own processes:

* fsdp2: PyTorch FSDP2, `fully_shard` on every ratrain unit and on the model, gradient sync on
  the last micro-batch only (`FSDP2Peer` in bench/peers.py), started by ratrain's local launcher.
* ratrain-sharded: `ratrain train --pp 1 --dp D --shard-state --view-window W` (the CLI a user
  runs), plus any rows of RATRAIN_ROWS or `--row NAME=FLAGS`: the same command with more flags.

Before that a probe checks that FSDP2 runs here at all (2 ranks, CPU, gloo); if it does not, the
fsdp2 rows are left out with the probe's error and the ratrain rows still run. The rows
alternate in rounds (table order in odd rounds, reversed in even ones), so a shared machine's
drift hits all alike. Per run: tokens/s over the steps after the first (the first pays for
warm-up allocations), the process peak RSS (ru_maxrss) and its growth since the first step,
per rank, and every step's loss. Reported per row: the median tokens/s over rounds, the largest
peak RSS and growth of any rank (median over rounds) and the largest relative loss difference
against ratrain-sharded at the same dp.

    python bench/fsdp.py [--model tiny] [--dps 2,4] [--steps 6] [--rounds 3] [--view-window 1]
                         [--row 'NAME=FLAGS' ...] [--tag TAG] [--out bench/results/fsdp_TAG.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ratrain.config import RunConfig
from ratrain.data.tokenizer import load_tokenizer
from ratrain.data.tokens import load_tokens
from ratrain.runtime.process_memory import RssGrowth, peak_memory_bytes
from ratrain.training.metrics import read_metrics
from ratrain.models.presets import get_preset
from ratrain.runtime.optim import lr_at
from ratrain.schedule.grid import RankGrid
from ratrain.errors import RankFailed
from ratrain.runtime.launch import launch_local
from ratrain.runtime.process_groups import init_groups
from ratrain.data.replica import make_data

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import FSDP2Peer, machine, summary, tokens_per_s  # noqa: E402

REFERENCE = "ratrain-sharded"
# name -> flags added to the reference's command; a variant of ratrain is one line here, e.g.
# "ratrain-transient": ["--grad-lifetime", "transient"],
RATRAIN_ROWS: dict[str, list[str]] = {REFERENCE: []}
MIB = 2**20


def config(args) -> RunConfig:
    """What every row trains: the CLI reads it as --config, the FSDP2 ranks as it is."""
    cfg = RunConfig(model=get_preset(args.model))
    t = cfg.train
    t.seq_len, t.global_batch, t.micro_batch_size = args.seq_len, args.global_batch, args.micro_batch_size
    t.steps, t.seed, t.dtype = args.steps, args.seed, "float32"
    t.eval_batches, t.checkpoint_every = 0, 0  # nothing but training steps in either row
    cfg.validate()
    return cfg


def ratrain_command(args, dp: int, flags: list[str], config_path: Path, run_dir: Path) -> list[str]:
    # --schedule 1f1b: a forward then a backward per micro-batch, FSDP2's loop (`auto` could pick
    # another order, and simulates at every start). --profile a preset: otherwise each run first
    # times a matmul for MFU.
    return [sys.executable, "-m", "ratrain.cli", "train", "--config", str(config_path),
            "--pp", "1", "--dp", str(dp), "--shard-state", "--view-window", str(args.view_window),
            "--schedule", "1f1b", "--threads", "1", "--profile", "cpu-local",
            "--run-dir", str(run_dir), "--no-progress", "--no-trace", "--no-report", *flags]


def rows(args) -> dict[str, list[str] | None]:
    """Row name -> extra ratrain flags; None: the FSDP2 peer."""
    out: dict[str, list[str] | None] = {"fsdp2": None, **RATRAIN_ROWS}
    for item in args.row:
        name, sep, flags = item.partition("=")
        if not sep or not name.strip() or name.strip() in out:
            raise SystemExit(f"--row {item!r}: give NAME=FLAGS with a new name")
        out[name.strip()] = shlex.split(flags)
    return out


# --- FSDP2 ranks ----------------------------------------------------------------------------


def probe_rank() -> None:
    """Every FSDP2 feature the peer uses, on a toy model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    for sync in (False, True):
        model.set_requires_gradient_sync(sync)
        model(torch.randn(4, 8)).square().mean().backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    dist.destroy_process_group()


def probe_fsdp2(work: Path) -> str | None:
    """None if FSDP2 runs on CPU over gloo here, else the first rank's error."""
    try:
        launch_local(2, probe_rank, (), error_dir=work / "probe-errors", threads=1)
    except RankFailed as e:
        return str(e)
    return None


def fsdp2_rank(spec: dict) -> None:
    cfg = RunConfig.from_dict(spec["cfg"])
    t = cfg.train
    groups = init_groups(RankGrid(1, spec["dp"]), "gloo")
    loader, _ = make_data(cfg, load_tokenizer(cfg.data.tokenizer), spec["dp"], groups.replica)
    peer = FSDP2Peer(cfg, groups, t.grad_clip)
    dist.barrier()
    rss = RssGrowth()  # started where ratrain's training loop starts its own
    rss.start()
    times, losses = [], []
    for step in range(t.steps):
        batches = loader.step_batches(step)
        t0 = time.perf_counter()
        losses.append(peer.train_step(batches, lr_at(step, t)))
        times.append(time.perf_counter() - t0)
    mine = (peak_memory_bytes(groups.device), rss.peak())
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if groups.rank == 0:
        Path(spec["out"]).write_text(json.dumps({
            "description": peer.description, "step_times_s": times, "losses": losses,
            "peak_rss_bytes_per_rank": [r[0] for r in ranks],
            "rss_growth_bytes_per_rank": [r[1] for r in ranks]}))
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


# --- one run of a row -------------------------------------------------------------------------


def run_fsdp2(cfg: RunConfig, dp: int, work: Path) -> dict:
    out = work / f"fsdp2-{time.monotonic_ns()}.json"
    launch_local(dp, fsdp2_rank, ({"cfg": cfg.to_dict(), "dp": dp, "out": str(out)},),
                 error_dir=work / "errors", threads=1)
    return json.loads(out.read_text())


def run_ratrain(args, dp: int, flags: list[str], config_path: Path, work: Path) -> dict:
    run_dir = work / f"run-{time.monotonic_ns()}"
    cmd = ratrain_command(args, dp, flags, config_path, run_dir)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    metrics = read_metrics(run_dir / "metrics.jsonl")
    last = metrics[-1]  # both are peaks so far: the last step's are the run's
    return {"command": shlex.join(["python", *cmd[1:]]),
            "step_times_s": [m["step_time_s"] for m in metrics],
            "losses": [m["loss"] for m in metrics],
            "peak_rss_bytes_per_rank": last["peak_memory_bytes_per_rank"],
            "rss_growth_bytes_per_rank": last.get("rss_growth_bytes_per_rank")}


def max_rel_diff(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


def summarize(runs: list[dict], reference: list[dict] | None, tokens_per_step: int) -> dict:
    """A row's rounds -> its medians, and its losses against the reference row's (both
    deterministic: the first round's stand for all, `losses_repeat` says whether they did)."""
    growth = [max(r["rss_growth_bytes_per_rank"]) for r in runs if r["rss_growth_bytes_per_rank"]]
    rates = [tokens_per_s(r["step_times_s"], tokens_per_step) for r in runs]
    # Round i of every row ran back to back, so their ratio cancels the machine's drift.
    paired = reference and len(reference) == len(runs)
    return {
        "tokens_per_s": summary(rates),
        "vs_ratrain": (statistics.median(a / tokens_per_s(b["step_times_s"], tokens_per_step)
                                         for a, b in zip(rates, reference)) if paired else None),
        "peak_rss_mib": statistics.median(max(r["peak_rss_bytes_per_rank"]) for r in runs) / MIB,
        "rss_growth_mib": statistics.median(growth) / MIB if growth else None,
        "losses": runs[0]["losses"],
        "losses_repeat": all(r["losses"] == runs[0]["losses"] for r in runs),
        "max_rel_loss_diff_vs_ratrain": (max_rel_diff(runs[0]["losses"], reference[0]["losses"])
                                         if reference else None),
    }


def table(result: dict) -> str:
    lines = ["| dp | row | tokens/s (median, min-max) | vs ratrain-sharded (within rounds) | peak RSS/rank (MiB) "
             "| RSS growth/rank (MiB) | max rel. loss diff vs ratrain |", "|" + "---|" * 7]
    for dp, layout in result["layouts"].items():
        for name, row in layout["rows"].items():
            tps = row["tokens_per_s"]
            vs = "-" if row["vs_ratrain"] is None else f"{row['vs_ratrain']:.3f}"
            growth = "-" if row["rss_growth_mib"] is None else f"{row['rss_growth_mib']:.0f}"
            diff = row["max_rel_loss_diff_vs_ratrain"]
            lines.append(f"| {dp} | {name} | {tps['median']:.0f} ({tps['min']:.0f}-{tps['max']:.0f}) "
                         f"| {vs} | {row['peak_rss_mib']:.0f} | {growth} | "
                         f"{'-' if diff is None else f'{diff:.2e}'} |")
        for name, why in layout["failed"].items():
            lines.append(f"| {dp} | {name} | failed: {why.splitlines()[-1][:150]} | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # tiny by default: on 2 cores `small` takes ~11 min for the default rounds, tiny ~4
    ap.add_argument("--model", default="tiny", help="model preset (default tiny)")
    ap.add_argument("--dps", default="2,4", help="data-parallel degrees, comma-separated")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6, help="steps per run; the first is not timed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--view-window", type=int, default=1,
                    help="ratrain's --view-window (1: each unit's view gathered one unit ahead "
                         "and released after use, as FSDP2 reshards after forward)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row", action="append", default=[], metavar="NAME=FLAGS",
                    help="one more ratrain row: the reference command plus FLAGS (repeatable), "
                         "e.g. 'transient=--grad-lifetime transient'")
    ap.add_argument("--tag", help="names the result file (default: the model)")
    ap.add_argument("--out", type=Path, help="default bench/results/fsdp_TAG.json")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        raise SystemExit("--steps must be >= 2 (the first is not timed), --rounds >= 1")
    dps = [int(d) for d in args.dps.split(",")]
    out = args.out or ROOT / "bench" / "results" / f"fsdp_{args.tag or args.model}.json"
    cfg = config(args)
    plan = rows(args)
    tokens_per_step = cfg.train.global_batch * cfg.train.seq_len
    load_tokens(cfg.data, load_tokenizer(cfg.data.tokenizer), progress=True)  # ranks then mmap it
    started = time.perf_counter()
    result = {"benchmark": "fsdp", "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": shlex.join(["python", "bench/fsdp.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine(),
              "settings": {"model": args.model, "seq_len": cfg.train.seq_len,
                           "global_batch": cfg.train.global_batch,
                           "micro_batch_size": cfg.train.micro_batch_size,
                           "tokens_per_step": tokens_per_step, "steps": args.steps,
                           "rounds": args.rounds, "view_window": args.view_window,
                           "dtype": "float32", "lr": cfg.train.lr,
                           "warmup_steps": cfg.train.warmup_steps, "grad_clip": cfg.train.grad_clip,
                           "backend": "gloo", "threads_per_rank": 1, "rows": plan,
                           "config": cfg.to_dict()},
              "layouts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg.save(work / "config.yaml")
        error = probe_fsdp2(work)
        result["fsdp2"] = {"runs_on_cpu_gloo": error is None, "error": error}
        print(f"FSDP2 fully_shard on CPU over gloo (torch {torch.__version__}): "
              + ("runs" if error is None else f"DOES NOT RUN: {error}"), flush=True)
        for dp in dps:
            names = [n for n in plan if not (plan[n] is None and error)]
            runs: dict[str, list[dict]] = {n: [] for n in names}
            failed = {} if error is None else {"fsdp2": f"FSDP2 does not run here: {error}"}
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    if name in failed:
                        continue
                    try:
                        run = (run_fsdp2(cfg, dp, work) if plan[name] is None else
                               run_ratrain(args, dp, plan[name], work / "config.yaml", work))
                    except (RankFailed, RuntimeError) as e:  # the other rows still measure
                        failed[name] = str(e)
                        print(f"dp={dp} round {r + 1}: {name} FAILED: {e}", file=sys.stderr, flush=True)
                        continue
                    runs[name].append(run)
                    print(f"dp={dp} round {r + 1}: {name} {tokens_per_s(run['step_times_s'], tokens_per_step):.0f} "
                          f"tokens/s", file=sys.stderr, flush=True)
            reference = runs.get(REFERENCE) or None
            result["layouts"][str(dp)] = {
                "rows": {n: {**summarize(rs, reference, tokens_per_step),
                             "how": rs[0].get("description") or rs[0].get("command"), "rounds": rs}
                         for n, rs in runs.items() if rs and n not in failed},
                "failed": failed}
    result["wall_s"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwrote {out} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
