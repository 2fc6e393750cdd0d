"""ratrain with host-homed state against PyTorch FSDP2 with CPU offload, one GPU, one run.

Both rows train the same model (`--model`, `--layers` of its blocks), sequence length, global
batch, dtype, data, AdamW, learning-rate schedule and clipping (ratrain's), each in its own
process, one after the other, from the same initial weights: the peer builds ratrain's units
with `build_units(model, seed)`, exactly ratrain's step 0 (an export to Hugging Face holds the
same tensors; the fp32 CPU test's step-1 losses agree bit for bit at equal micro-batches), and
reads ratrain's loader's batches (`make_data`, `step_batches`).

* ratrain: `ratrain train --state-home host --activation recompute --view-window 1 --dtype D`,
  micro-batches of `--ratrain-micro-batch-size`, groups and update (carried when host-homed on a
  GPU) left to ratrain's defaults; or, with `--plan-profile P`, the plan `ratrain plan --profile
  P --devices 1 --memory-budget B` finds. Plus `--ratrain-flags`. No checkpoints or report.
* fsdp2-offload (bench/gpu_offload_peer.py, `FSDP2Peer`): `fully_shard` on every unit and the model with
  `CPUOffloadPolicy(pin_memory=True)` and `MixedPrecisionPolicy(param_dtype=D, reduce_dtype=
  fp32)`, activation checkpointing per decoder block, torch AdamW (fused, on the CPU with the
  offloaded state), a process group of one, gradients synced every micro-batch. Micro-batch
  sizes are tried from large to small, each in a fresh process, until one runs every step: the
  largest that fits is the fastest, as each micro-batch moves all weights to the GPU twice
  (forward, backward) and all gradients back.

On a GPU both run under `torch.cuda.set_per_process_memory_fraction(budget / total)`: neither
may reserve more than `--memory-budget` (past it, a CUDA OOM). On `--device cpu` (a smoke test)
CPUOffloadPolicy runs unpinned (pinning needs an accelerator), and the row says so.

Per row: tokens/s over the steps after the first, MFU (training/mfu.py: 6N + attention per token
over the device's peak), peak CUDA memory allocated, peak host RSS (wait4), ratios ratrain /
peer; then the per-step losses side by side.

The loss tolerance. Same weights, tokens and modules: only the order of roundings differs
(micro-batch sizes change GEMM shapes, so cuBLAS's reduction order; gradients are summed in
another order; ratrain's host norm adds in fp64). bfloat16 keeps 8 significant bits: up to
2^-8 = 0.39% relative rounding per operation. Step 1's loss, an fp32 mean over every token,
differs by far less. Later steps differ more: AdamW's update lr * m / (sqrt(v) + eps) is about
lr whatever the gradient's size, so an element whose gradient sign the roundings decide moves a
full step either way. The bound is 4 x 2^-8 = 2^-6 = 1.6% at any step (fp32: 1e-4, the same
argument at 2^-24). A different batch or learning rate moves the loss by more within a few
steps; a uniform gradient scale (accumulation's 1/n, clipping) is nearly invisible to AdamW, so
this check does not vouch for it.

    python bench/gpu_offload.py [--layers 8] [--steps 20] [--global-batch 16]
        [--peer-micro-batch-sizes 8,4,2,1] [--plan-profile FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from gpu_offload_report import (PEER, TOLERANCE, compare_losses, merged, summarize,  # noqa: E402
                                table)

# ratrain's CLI under the peer's allocator cap, set before ratrain touches the GPU.
CAPPED_CLI = ("import sys, torch\nbudget = float(sys.argv.pop(1))\n"
              "total = torch.cuda.get_device_properties(0).total_memory\n"
              "torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), 0)\n"
              "from ratrain.cli import main\nsys.argv[0] = 'ratrain'\nmain()\n")


def config(args):
    from ratrain.config import RunConfig
    from ratrain.models.presets import get_preset

    cfg = RunConfig(model=get_preset(args.model))
    if args.layers:
        cfg.model.n_layers, cfg.model.name = args.layers, f"{args.model}-{args.layers}blocks"
    cfg.model.max_seq_len = max(cfg.model.max_seq_len, args.seq_len)
    t = cfg.train
    t.seq_len, t.global_batch, t.micro_batch_size = args.seq_len, args.global_batch, args.ratrain_micro_batch_size
    t.steps, t.seed, t.dtype, t.lr = args.steps, args.seed, args.dtype, args.lr
    t.warmup_steps = args.steps // 4 if args.warmup is None else args.warmup
    t.eval_every, t.eval_batches, t.checkpoint_every, t.checkpoints = 0, 0, 0, False
    if args.data:
        cfg.data.path = str(Path(args.data).resolve())
    cfg.validate()
    return cfg


def run_child(cmd: list[str], log: Path, device: str) -> tuple[int, int, str]:
    """Run cmd to its end, output to `log`: (exit code, the process's peak RSS, the log's tail)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    # both rows' allocators grow by mapping, not by fixed segments: under the budget's cap,
    # fragmentation would otherwise refuse what fits (ratrain sets the same; torchtitan too)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # ratrain takes the GPU wherever it sees one
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # its own rusage: the peak RSS of this child
        except BaseException:  # stopped (a time limit's SIGTERM): the child, holding the GPU, too
            proc.kill()
            proc.wait()
            raise
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    lines = log.read_text(errors="replace").splitlines()
    return proc.returncode, usage.ru_maxrss * 1024, "\n".join(lines[-15:])


# --- ratrain ----------------------------------------------------------------------------------


def ratrain_commands(args, config_path: Path, work: Path) -> list[list[str]]:
    """`ratrain plan` (with --plan-profile), then `ratrain train`, as a user types them."""
    common = ["--config", str(config_path)]
    if not args.plan_profile:
        return [["ratrain", "train", *common, "--state-home", "host", "--activation", "recompute",
                 "--view-window", "1", "--dtype", args.dtype, *ratrain_tail(args, work)]]
    plan = work / "plan.json"
    profile = str(Path(args.plan_profile).resolve()) if Path(args.plan_profile).is_file() else args.plan_profile
    return [["ratrain", "plan", *common, "--profile", profile, "--devices", "1",
             "--memory-budget", args.memory_budget, "--out", str(plan),
             *shlex.split(args.plan_flags)],
            ["ratrain", "train", *common, "--plan", str(plan), *ratrain_tail(args, work)]]


def ratrain_tail(args, work: Path) -> list[str]:
    return ["--run-dir", str(work / "ratrain-run"), "--no-progress", "--no-trace", "--no-report",
            "--no-checkpoints", *shlex.split(args.ratrain_flags)]


def run_ratrain(args, config_path: Path, work: Path) -> dict:
    from ratrain.config import RunConfig
    from ratrain.training.metrics import read_metrics

    commands = ratrain_commands(args, config_path, work)
    shutil.rmtree(work / "ratrain-run", ignore_errors=True)  # a kept --work-dir's earlier run
    row = {"commands": [shlex.join(c) for c in commands], "memory_cap": args.device == "cuda"}
    for cmd in commands:  # only training runs under the cap, and its peak RSS is the row's
        capped = cmd[1] == "train" and args.device == "cuda"
        argv = [sys.executable, *(["-c", CAPPED_CLI, str(args.budget_bytes)] if capped else ["-m", "ratrain.cli"]), *cmd[1:]]
        code, rss, tail = run_child(argv, work / f"ratrain-{cmd[1]}.log", args.device)
        if code:
            return {**row, "error": f"ratrain {cmd[1]} exit {code}:\n{tail}"}
    run_dir = work / "ratrain-run"
    metrics = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text()) if (run_dir / "plan.json").exists() else {}
    mbs = RunConfig.load(run_dir / "config.yaml").train.micro_batch_size  # a plan may choose it
    group = plan.get("micro_batch_group") or 1
    return {**row, "micro_batch": f"{plan.get('n_micro')} x {mbs}" + (f", groups of {group}" if group > 1 else ""),
            "losses": [m["loss"] for m in metrics], "step_times_s": [m["step_time_s"] for m in metrics],
            "peak_cuda_bytes": metrics[-1]["peak_memory_bytes"] if args.device == "cuda" else None,
            "peak_host_bytes": rss, "peak_flops": summary.get("peak_flops"),
            "peak_flops_source": summary.get("peak_flops_source"),
            "plan": {k: plan.get(k) for k in ("schedule", "n_micro", "micro_batch_group", "update",
                                              "activation", "view_window", "state_home",
                                              "device_units")},
            "prediction": plan.get("prediction")}  # the plan's: against what the run measured


# --- the FSDP2 CPU-offload peer ---------------------------------------------------------------


def run_peer_at(args, cfg, size: int, work: Path) -> dict:
    cfg = type(cfg).from_dict(cfg.to_dict())
    cfg.train.micro_batch_size = size
    files = {k: str(work / f"peer-{size}.{k}") for k in ("spec", "store", "out", "log")}
    for stale in ("store", "out"):  # a FileStore must start empty; a kept --work-dir's earlier run
        Path(files[stale]).unlink(missing_ok=True)
    Path(files["spec"]).write_text(json.dumps({"cfg": cfg.to_dict(), "device": args.device,
                                               "budget": args.budget_bytes, **files}))
    code, rss, tail = run_child([sys.executable, str(ROOT / "bench" / "gpu_offload_peer.py"), files["spec"]],
                                Path(files["log"]), args.device)
    if code or not Path(files["out"]).exists():
        return {"error": f"peer exit {code}:\n{tail}"}
    return {**json.loads(Path(files["out"]).read_text()), "peak_host_bytes": rss}


def choose_peer(sizes: list[int], run_at) -> tuple[dict | None, list[dict]]:
    """`run_at(size)` from the largest size down until one runs every step: (that run or None,
    every attempt as {micro_batch_size, outcome}). Any failure tries the next size: a CUDA OOM
    may also surface as a cuBLAS or NCCL error."""
    tried = []
    for size in sorted(sizes, reverse=True):
        run = run_at(size)
        outcome = run.get("error") or (f"OOM at {run['oom']}" if "oom" in run else "fits")
        tried.append({"micro_batch_size": size, "outcome": outcome})
        if outcome == "fits":
            return run, tried
    return None, tried


def _stopped(signum, frame) -> None:
    raise SystemExit(128 + signum)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = ap.add_argument
    add("--model", default="llama2-7b", help="model preset (default llama2-7b)")
    add("--layers", type=int, help="decoder blocks instead of the preset's")
    add("--seq-len", type=int, default=4096)
    add("--global-batch", type=int, default=16)
    add("--steps", type=int, default=20, help="steps per row; the first is not timed")
    add("--dtype", default="bfloat16", choices=sorted(TOLERANCE))
    add("--lr", type=float, default=3e-4)
    add("--warmup", type=int, help="warmup steps (default steps // 4)")
    add("--seed", type=int, default=0)
    add("--data", help="ratrain's --data (default: its built-in corpus)")
    add("--memory-budget", default="20GB", help="CUDA memory each row may reserve")
    add("--ratrain-micro-batch-size", type=int, default=1)
    add("--plan-profile", help="train the plan of `ratrain plan --profile THIS --devices 1 "
        "--memory-budget B` instead of the fixed flags")
    add("--plan-flags", default="", help="more flags for `ratrain plan` (--host-memory-budget)")
    add("--ratrain-flags", default="", help="more flags for `ratrain train`")
    add("--peer-micro-batch-sizes", help="comma-separated (default: every divisor of the global batch)")
    add("--rows", default="both", choices=["both", "ratrain", "peer"],
        help="run only one row (a GPU session's calls can take them one at a time)")
    add("--merge", nargs=2, metavar=("RATRAIN_JSON", "PEER_JSON"),
        help="run nothing: one result of a --rows ratrain and a --rows peer run, losses compared")
    add("--device", default="cuda", choices=["cuda", "cpu"])
    add("--work-dir", type=Path, help="keep the runs' files here (default: a temporary directory)")
    add("--out", type=Path, help="default bench/results/gpu_offload_MODEL.json")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.merge:
        try:
            result = merged(*(json.loads(Path(f).read_text()) for f in args.merge))
        except ValueError as e:
            raise SystemExit(str(e))
        out = args.out or ROOT / "bench" / "results" / "gpu_offload_merged.json"
        out.write_text(json.dumps(result, indent=2))
        print(table(result) + f"\n\nwrote {out}")
        return 0 if result["losses"] and result["losses"]["within_tolerance"] else 1
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2 (the first is not timed)")
    from peers import machine
    from ratrain.data.tokenizer import load_tokenizer
    from ratrain.data.tokens import load_tokens
    from ratrain.planner.budget import parse_bytes
    from ratrain.training.mfu import flops_per_token, gpu_peak

    args.budget_bytes = parse_bytes(args.memory_budget)
    cfg = config(args)
    g = cfg.train.global_batch
    sizes = ([int(s) for s in args.peer_micro_batch_sizes.split(",")] if args.peer_micro_batch_sizes
             else [d for d in range(g, 0, -1) if g % d == 0])
    if any(s < 1 or g % s for s in sizes):
        raise SystemExit(f"--peer-micro-batch-sizes must divide the global batch {g}")
    load_tokens(cfg.data, load_tokenizer(cfg.data.tokenizer), progress=True)  # the rows then mmap it
    out = args.out or ROOT / "bench" / "results" / f"gpu_offload_{cfg.model.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        cfg.save(work / "config.yaml")
        ratrain = ({"skipped": "--rows peer"} if args.rows == "peer" else
                   run_ratrain(args, work / "config.yaml", work))
        print(f"ratrain: {ratrain.get('error') or 'done'}", file=sys.stderr, flush=True)
        # kept if the peer's tries outlast the caller's time limit (a GPU session's minutes),
        # with the steps the peer had run when a SIGTERM stopped it
        partial = {"benchmark": "gpu_offload", "partial": "the peer had not run",
                   "rows": {"ratrain": ratrain}}
        out.write_text(json.dumps(partial, indent=2))
        try:
            peer, tried = (({"skipped": "--rows ratrain"}, []) if args.rows == "ratrain" else
                           choose_peer(sizes, lambda s: run_peer_at(args, cfg, s, work)))
        except SystemExit:
            steps = sorted(work.glob("peer-*.out.steps"), key=lambda p: p.stat().st_mtime)
            partial["partial"] = "stopped while the peer ran"
            if steps:
                partial["peer_steps"] = json.loads(steps[-1].read_text())
            out.write_text(json.dumps(partial, indent=2))
            raise
        print(f"peer: {tried}", file=sys.stderr, flush=True)
    if peer is None:
        peer = {"error": "no micro-batch size ran every step: " + "; ".join(t["outcome"] for t in tried)}
    elif "skipped" not in peer:
        peer["micro_batch"] = f"{g // peer['micro_batch_size']} x {peer['micro_batch_size']}"
    peak = ratrain.get("peak_flops")  # ratrain's: the GPU's datasheet, or the CPU's measured
    if not peak and args.device == "cuda" and peer.get("device_name"):
        peak = gpu_peak(peer["device_name"], cfg.train.dtype, 1).flops
    rows = {"ratrain": ratrain, PEER: peer}
    tokens_per_step = g * cfg.train.seq_len
    summarize(rows, tokens_per_step, flops_per_token(cfg.model, cfg.train.seq_len), peak)
    result = {"benchmark": "gpu_offload", "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": shlex.join(["python", "bench/gpu_offload.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine(),
              "settings": {"model": cfg.model.name, "n_layers": cfg.model.n_layers, "seq_len": cfg.train.seq_len,
                           "global_batch": g, "tokens_per_step": tokens_per_step, "steps": cfg.train.steps,
                           "dtype": cfg.train.dtype, "device": args.device, "memory_budget_bytes": args.budget_bytes,
                           "peak_flops": peak, "config": cfg.to_dict()},
              "rows": rows, "peer_tried": tried,
              "losses": (compare_losses(ratrain["losses"], peer["losses"], cfg.train.dtype)
                         if "losses" in ratrain and "losses" in peer else None),
              "wall_s": time.perf_counter() - started}
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwrote {out} ({result['wall_s']:.0f} s)")
    if args.rows != "both":
        return 1 if any("error" in row for row in rows.values()) else 0
    return 0 if result["losses"] and result["losses"]["within_tolerance"] else 1


if __name__ == "__main__":
    # a caller's time limit (SIGTERM) stops the row's child too, and keeps the peer's steps;
    # set here, not in main(), which tests call in their own process
    signal.signal(signal.SIGTERM, _stopped)
    sys.exit(main())
