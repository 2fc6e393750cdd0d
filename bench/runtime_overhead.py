"""Runtime overhead: ratrain's `baseline` 1F1B vs torch.distributed.pipelining's Schedule1F1B.

Two ranks (pp=2, dp=1, gloo, one thread each) train the same model from the same initial weights
on the same batches, under both implementations, in one process group:

* ratrain: `PipelineEngine` with the plan `ratrain train --pp 2` builds (`plan_here`), a `Tracer`
  attached as the CLI does by default.
* torch:   `PipelineStage` over an `nn.Sequential` of the *same* ratrain units (stage 0 =
  embedding + first half of the blocks, stage 1 = the rest + head, ratrain's default split),
  `Schedule1F1B(loss_fn=lm_loss)` (its default `scale_grads=True` divides the gradients by
  n_microbatches, which is ratrain's 1/n_micro loss scaling), then `torch.optim.AdamW`
  (fused=True, ratrain's settings and weight-decay groups) and an all_reduce of the loss over
  the pipeline group, the counterpart of ratrain's end-of-step `E` action (`PipelinePeer` in
  bench/peers.py, which bench/schedules.py shares).

Clipping is off on both (grad_clip 0), the learning rate is constant (train.lr) on both. The
implementations alternate in rounds (`--steps` steps of one, then of the other; which one goes
first alternates from round to round) so drift on a shared machine hits both alike. Each step is
timed on rank 0 with perf_counter; a round's rate is its tokens over the sum of its step times;
the table reports the median, min and max over rounds.

    python bench/runtime_overhead.py [--model tiny] [--seq-len 256] [--micro-batch-size 2]
        [--n-micro 4] [--steps 10] [--rounds 3] [--warmup 2] [--out bench/results/runtime_overhead.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import torch.distributed as dist

from ratrain.config import DataConfig, ParallelConfig, RunConfig, TrainConfig
from ratrain.data.loader import MicroBatchLoader
from ratrain.data.tokenizer import check_fits, load_tokenizer
from ratrain.data.tokens import load_tokens, split_train_val
from ratrain.models.presets import get_preset
from ratrain.runtime.engine import PipelineEngine
from ratrain.schedule.grid import RankGrid
from ratrain.runtime.launch import launch_local
from ratrain.runtime.worker_errors import record_failure
from ratrain.runtime.process_groups import init_groups
from ratrain.training.prepare import plan_here
from ratrain.runtime.trace import Tracer

from peers import PipelinePeer, machine
from peers import summary as stat_summary

PP = 2
IMPLS = ("ratrain", "torch")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "runtime_overhead.json"


def make_config(args) -> RunConfig:
    cfg = RunConfig(
        model=get_preset(args.model),
        data=DataConfig(),  # byte-tokenized standard library
        train=TrainConfig(
            seq_len=args.seq_len,
            micro_batch_size=args.micro_batch_size,
            global_batch=args.micro_batch_size * args.n_micro,
            steps=args.warmup + args.steps * args.rounds,
            grad_clip=0.0,  # clipping off on both sides
            eval_batches=0,
            seed=0,
        ),
        parallel=ParallelConfig(pp=PP, dp=1, policy="baseline", backend="gloo", threads_per_rank=1),
    )
    cfg.validate()
    return cfg


# --- per rank -----------------------------------------------------------------------------------


def _trace_breakdown(events, n_steps: int) -> dict:
    """Per step: seconds spent inside each action category, and between actions."""
    by_cat: dict[str, float] = defaultdict(float)
    spans: dict[int, list[float]] = {}
    busy = 0.0
    for step, name, t0, t1 in events:
        by_cat[name.rstrip("0123456789.")] += (t1 - t0) / 1e6
        busy += (t1 - t0) / 1e6
        s = spans.setdefault(step, [t0, t1])
        s[0], s[1] = min(s[0], t0), max(s[1], t1)
    span = sum(t1 - t0 for t0, t1 in spans.values()) / 1e6
    out = {k: v / n_steps for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])}
    out["(between actions)"] = (span - busy) / n_steps
    out["(step span)"] = span / n_steps
    return out


def rank_main(cfg_dict: dict, opts: dict, result_path: str, error_dir: str) -> None:
    rank = int(os.environ["RANK"])
    try:
        _bench(RunConfig.from_dict(cfg_dict), opts, Path(result_path))
    except BaseException as e:
        record_failure(Path(error_dir), rank, e)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _bench(cfg: RunConfig, opts: dict, result_path: Path) -> None:
    groups = init_groups(RankGrid(PP, 1), "gloo")
    is_main = groups.rank == 0
    t = cfg.train
    train_tokens, _ = split_train_val(
        load_tokens(cfg.data, load_tokenizer(cfg.data.tokenizer), progress=False), cfg.data.val_fraction)
    loader = MicroBatchLoader(train_tokens, t.seq_len, t.global_batch, t.micro_batch_size, seed=t.seed)

    plan = plan_here(cfg)
    tracer = Tracer(keep_steps=max(opts["steps"], opts["warmup"], 1))
    engine = PipelineEngine(cfg, plan, groups, tracer)  # what `ratrain train --pp 2` builds
    peer = PipelinePeer(cfg, plan.stage_units[groups.stage], groups)  # dp=1, no clipping
    steps_fn = {"ratrain": lambda b: engine.train_step(b, t.lr).loss, "torch": peer.train_step}
    next_step = dict.fromkeys(IMPLS, 0)  # both walk the loader's steps 0, 1, 2, ... alike
    tokens_per_step = t.global_batch * t.seq_len

    def phase(impl: str, n: int, profile: cProfile.Profile | None = None):
        dist.barrier()
        tracer.reset_origin()
        times, losses = [], []
        for _ in range(n):
            batches = loader.step_batches(next_step[impl])
            next_step[impl] += 1
            if profile:
                profile.enable()
            t0 = time.perf_counter()
            loss = steps_fn[impl](batches)
            times.append(time.perf_counter() - t0)
            if profile:
                profile.disable()
            losses.append(loss)
        dist.barrier()
        return times, losses

    def say(msg: str) -> None:
        if is_main:
            print(msg, flush=True)

    first_loss, warm_times = {}, {}
    for impl in IMPLS:
        times, losses = phase(impl, opts["warmup"])
        warm_times[impl] = times
        if losses:
            first_loss[impl] = losses[0]

    rounds = []
    trace_sums: dict[str, float] = defaultdict(float)
    n_traced = 0
    for r in range(opts["rounds"]):
        order = IMPLS if r % 2 == 0 else IMPLS[::-1]
        row = {"round": r + 1, "order": list(order)}
        for impl in order:
            times, losses = phase(impl, opts["steps"])
            if impl not in first_loss:
                first_loss[impl] = losses[0]
            row[impl] = {"tokens_per_s": tokens_per_step * len(times) / sum(times),
                         "step_times_s": times, "losses": losses}
            if impl == "ratrain":
                for k, v in _trace_breakdown(tracer.events(), len(times)).items():
                    trace_sums[k] += v
                n_traced += 1
        say(f"round {r + 1}/{opts['rounds']} ({' then '.join(order)}): "
            + ", ".join(f"{impl} {row[impl]['tokens_per_s']:.0f} tok/s" for impl in IMPLS))
        rounds.append(row)

    profiles = {}
    if opts["profile"]:
        for impl in IMPLS:
            prof = cProfile.Profile()
            phase(impl, opts["steps"], prof)
            if is_main:
                buf = io.StringIO()
                stats = pstats.Stats(prof, stream=buf)
                stats.sort_stats("tottime").print_stats(30)
                profiles[impl] = buf.getvalue()

    breakdown = {k: v / n_traced for k, v in trace_sums.items()}
    all_breakdowns = [None] * PP
    dist.all_gather_object(all_breakdowns, breakdown)
    if not is_main:
        return
    result_path.write_text(json.dumps({
        "rounds": rounds,
        "first_step_loss": first_loss,
        "warmup_step_times_s": warm_times,
        "ratrain_trace_per_step_s": {f"rank {i}": b for i, b in enumerate(all_breakdowns)},
        "profiles_rank0": profiles,
        "plan": plan.to_dict(),
    }))


# --- driver -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="model preset (default: tiny)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--n-micro", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per implementation per round")
    ap.add_argument("--rounds", type=int, default=24,
                    help="rounds; many short ones pair the two sides under the same machine noise")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per implementation first")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--profile", action="store_true",
                    help="after the rounds, run one cProfile'd phase of each on rank 0 (untimed)")
    args = ap.parse_args(argv)
    if min(args.steps, args.rounds) < 1 or args.warmup < 0:
        ap.error("--steps and --rounds must be >= 1, --warmup >= 0")

    cfg = make_config(args)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_fits(tokenizer, cfg.model.vocab_size)
    load_tokens(cfg.data, tokenizer, progress=True)  # tokenize once; ranks memory-map the cache
    opts = {"steps": args.steps, "rounds": args.rounds, "warmup": args.warmup, "profile": args.profile}
    print(f"{cfg.model.name}: pp={PP} dp=1 gloo, 1 thread/rank, seq_len {cfg.train.seq_len}, "
          f"{cfg.n_micro} micro-batches of {cfg.train.micro_batch_size} "
          f"({cfg.train.global_batch * cfg.train.seq_len} tokens/step), stages "
          f"{[list(r) for r in plan_here(cfg).stage_units]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "rank0.json"
        started = time.perf_counter()
        launch_local(PP, rank_main, (cfg.to_dict(), opts, str(result_path), str(Path(tmp) / "errors")),
                     error_dir=Path(tmp) / "errors", threads=1)
        raw = json.loads(result_path.read_text())
        wall = time.perf_counter() - started

    rates = {impl: [row[impl]["tokens_per_s"] for row in raw["rounds"]] for impl in IMPLS}
    summary = {impl: stat_summary(rates[impl]) for impl in IMPLS}
    torch_median = summary["torch"]["median"]
    for impl in IMPLS:
        summary[impl]["ratio_vs_torch"] = summary[impl]["median"] / torch_median
    # Each round's ratrain rate over the torch rate of the same round: drift between rounds cancels.
    paired = [a / b for a, b in zip(rates["ratrain"], rates["torch"])]
    summary["paired_ratio_ratrain_vs_torch"] = {**stat_summary(paired), "per_round": paired}

    print(f"\nfirst-step loss: ratrain {raw['first_step_loss']['ratrain']:.6f}  "
          f"torch {raw['first_step_loss']['torch']:.6f}")
    last = {impl: raw["rounds"][-1][impl]["losses"][-1] for impl in IMPLS}
    # Both walk the loader's steps in the same order, so their step-k losses should agree.
    seqs = {impl: [x for row in raw["rounds"] for x in row[impl]["losses"]] for impl in IMPLS}
    max_diff = max(abs(a - b) for a, b in zip(seqs["ratrain"], seqs["torch"]))
    print(f"last-step loss:  ratrain {last['ratrain']:.6f}  torch {last['torch']:.6f}  "
          f"(max |difference| over all {len(seqs['torch'])} timed steps: {max_diff:.3g})\n")
    header = f"{'implementation':<28} {'tokens/s median':>15} {'min':>9} {'max':>9} {'vs torch':>9}"
    print(header)
    print("-" * len(header))
    names = {"ratrain": "ratrain baseline 1F1B", "torch": "torch Schedule1F1B"}
    for impl in IMPLS:
        s = summary[impl]
        print(f"{names[impl]:<28} {s['median']:>15.0f} {s['min']:>9.0f} {s['max']:>9.0f} "
              f"{s['ratio_vs_torch']:>9.3f}")
    p = summary["paired_ratio_ratrain_vs_torch"]
    print(f"ratrain / torch within each round: median {p['median']:.3f} "
          f"(per round: {', '.join(f'{x:.3f}' for x in p['per_round'])})")
    print("\nratrain per-step time by action category (s, mean over timed steps):")
    for rank, b in raw["ratrain_trace_per_step_s"].items():
        print(f"  {rank}: " + ", ".join(f"{k} {v * 1e3:.1f}ms" for k, v in b.items()))
    for impl, text in raw["profiles_rank0"].items():
        print(f"\n--- cProfile, rank 0, {impl}, {args.steps} steps (tottime) ---\n{text}")

    result = {
        "benchmark": "runtime_overhead",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
        "machine": machine(),
        "config": {"model": args.model, "pp": PP, "dp": 1, "backend": "gloo", "threads_per_rank": 1,
                   "seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size,
                   "n_micro": args.n_micro, "global_batch": cfg.train.global_batch,
                   "tokens_per_step": cfg.train.global_batch * cfg.train.seq_len,
                   "steps_per_round": args.steps, "rounds": args.rounds, "warmup": args.warmup,
                   "grad_clip": 0.0, "lr": cfg.train.lr},
        "summary_tokens_per_s": summary,
        "first_step_loss": raw["first_step_loss"],
        "last_step_loss": last,
        "max_abs_loss_difference": max_diff,
        "wall_s": wall,
        **{k: raw[k] for k in ("rounds", "warmup_step_times_s", "ratrain_trace_per_step_s", "plan")},
    }
    if raw["profiles_rank0"]:
        result["profiles_rank0"] = raw["profiles_rank0"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out} ({wall:.0f}s)")
    return result


if __name__ == "__main__":
    main()
