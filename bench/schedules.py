"""Schedules: ratrain's `ratrain` and `baseline` policies against the torch peer a user would pick.

For each configuration (pipeline degree pp, data-parallel degree dp, rank order), several
implementations train the same model from the same initial weights on the same batches, in the
same processes and process group (gloo, one thread per rank), interleaved in rounds. Always:

* ratrain:  `PipelineEngine` with the plan of `policy="ratrain"` and schedule 1f1b (`plan_here`), a
  `Tracer` attached as the CLI does by default.
* baseline: the same with `policy="baseline"` (GPU-style 1F1B: every gradient synchronized after
  the pipeline flush, one optimizer step at the end).
* peer:     pp = 1: PyTorch `DistributedDataParallel` (no_sync for all but the last micro-batch,
  `clip_grad_norm_`); pp > 1: `torch.distributed.pipelining`'s `Schedule1F1B` over the same
  ratrain units with each stage module wrapped in DDP over its replicas, as torchtitan does
  (`--peer-sync allreduce`: one all_reduce after the schedule instead). See bench/peers.py.

and on request:

* auto (`--auto`): the engine with the plan `ratrain train`'s default flags make: policy ratrain,
  `--schedule auto` (in two-node mode on the links the probe measures at the start; rank 0 says
  what it chose and why, and the result keeps the plan).
* zbh1-PLACEMENT (`--split bubble,grouped`, one each): the ratrain row's engine with schedule
  zbh1 (every backward split into input and weight gradients) and that weight-gradient placement
  (`parallel.weight_grad`), policy ratrain, traced alike.
* 1f1b-gG (`--groups 2,4`, one each): the ratrain row's engine in unit-major groups of G
  micro-batches (`parallel.micro_batch_group`): each unit's gradient final after its group's
  backwards, not the last micro-batch's.
* peer-zb (`--peer-zb`, pp > 1 only; at pp = 1 skipped with a line): torch's
  `ScheduleInterleavedZeroBubble` with one stage per rank (the same non-interleaved layout as the
  peer), replicas averaged by one all_reduce after the schedule whatever `--peer-sync` says (DDP
  would average stage 0 only: the split weight backward bypasses its hooks). torch refuses
  n_micro that is not a multiple of max(1, n_micro // pp); such a layout skips it with torch's
  message.

All clip by the global gradient norm (`--clip`, default 1.0, the training default; 0 turns
clipping off), use AdamW with ratrain's settings and a constant learning rate (train.lr), and
end each step with the loss reduced to every rank. Each implementation keeps its own step
counter, so all walk the loader's steps 0, 1, 2, ... alike and their step-k losses must agree
(the maximum difference of every pair is printed). A round runs `--steps` steps of each
implementation (in the list's order, ratrain, baseline, zbh1-*, peer, peer-zb, in odd rounds,
reversed in even ones), with a barrier between phases; every step is timed on rank 0 with
perf_counter; a round's rate is its tokens over the sum of its step times. The tables report
per-implementation medians over rounds and the within-round ratios (ratrain against baseline and
each peer; each zbh1-* against ratrain, baseline and peer-zb), and beside them the 1F1B bound, a
lower bound on the step time of a 1F1B schedule in the configuration:

    max(compute including the 1F1B bubble, bytes crossing the slow link in one direction / rate)

compute: t[s], the forward + backward time of one micro-batch on stage s, measured after the
rounds on fresh copies of the stage's units, one rank at a time (nothing else on the cores; the
fastest of the stage's replicas); compute = max(sum_s t + (n_micro - 1) * max_s t (the 1F1B
bubble: (n_micro + pp - 1) * t for equal stages), n_micro * dp * sum_s t / min(ranks, cores)
(more ranks than cores share them)). A split backward (zbh1, peer-zb) fills part of that bubble
with weight gradients, so its step can beat the pipeline term: a ratio to the bound below 1 is
no error. link (two-node mode only): the activations and their gradients of every micro-batch
whose neighbouring stages sit on different nodes, plus, for every stage whose replicas sit on
both nodes, that stage's fp32 gradient bytes (what an all-reduce must at least move across the
cut, each way). The same per-micro-batch compute as ratrain's traces saw it during the timed
steps (shared cores included) is printed beside it.

`--link RATE` runs the ranks as two nodes: two network namespaces joined by a veth pair with a
`tbf` qdisc of RATE on both ends, the ranks of each node started by `torchrun` inside its
namespace (needs root). Without it, the ranks run locally over loopback.

    python bench/schedules.py [--configs 1x2,2x2:pp-dp,2x2:dp-pp] [--link 200mbit]
        [--model tiny] [--seq-len 256] [--global-batch 16] [--micro-batch-size B] [--clip 1.0]
        [--steps 3] [--rounds 12] [--warmup 1] [--auto] [--split bubble,grouped] [--groups 2] [--peer-zb]
        [--out bench/results/schedules.json]
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

from ratrain.data.tokenizer import check_fits, load_tokenizer
from ratrain.data.tokens import load_tokens
from ratrain.errors import RankFailed, UserError
from ratrain.runtime.launch import launch_local
from ratrain.training.prepare import plan_here

from peers import machine
from schedules_args import parser
from schedules_implementations import implementations, make_config
from schedules_layout import Layout, parse_layouts
from schedules_report import analyse, print_layout, print_overview
from schedules_worker import rank_main, worker_main
from two_nodes import LinkUnavailable, TwoNodes, parse_rate

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
START_LINES = ("links measured", "schedule ", "low-communication")  # setup's lines on auto


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.split("\n\n")[0]).parse_args(argv)
    if args.worker:
        worker_main(args.worker)  # does not return
    try:
        return _main(args, argv)
    except LinkUnavailable as e:
        print(f"--link needs root and network namespaces (ip netns, veth, tc tbf): {e}",
              file=sys.stderr)
        return 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RankFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if e.user_error else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(args, argv) -> int:
    if min(args.steps, args.rounds) < 1 or args.warmup < 0:
        raise UserError("--steps and --rounds must be >= 1, --warmup >= 0")
    if args.clip < 0:
        raise UserError("--clip must be >= 0")
    if (args.pp is None) != (args.dp is None):
        raise UserError("--pp and --dp go together")
    layouts = ([Layout(args.pp, args.dp, args.rank_order)] if args.pp is not None
               else parse_layouts(args.configs, args.rank_order))
    if min(min(x.pp, x.dp) for x in layouts) < 1:
        raise UserError("--pp and --dp must be >= 1")
    rate_bps = parse_rate(args.link) if args.link else None
    if rate_bps and any(x.world % 2 for x in layouts):
        raise UserError("--link runs two nodes with the same number of ranks: every pp x dp must be even")
    impls = {x: implementations(args, x) for x in layouts}
    cfgs = {x: {d["name"]: make_config(args, x, d) for d in impls[x][0] if d["kind"] == "engine"}
            for x in layouts}
    for cfg in (cfg for per in cfgs.values() for cfg in per.values()):
        # too few micro-batches for the stages etc.: a UserError, before launching; on a copy,
        # since an auto schedule is chosen into the config it plans (on this process's links)
        plan_here(copy.deepcopy(cfg))
    # SIGTERM ends the run like Ctrl-C, through the finally blocks that remove the namespaces.
    signal.signal(signal.SIGTERM, _interrupt)
    with TwoNodes(args.link) if rate_bps else nullcontext() as net:  # no link here: one line, exit 2
        return _run(args, argv, layouts, impls, cfgs, rate_bps, net)


def _run(args, argv, layouts: list[Layout], impls: dict, cfgs: dict, rate_bps: float | None,
         net) -> int:
    base = cfgs[layouts[0]]["baseline"]
    tokenizer = load_tokenizer(base.data.tokenizer)
    check_fits(tokenizer, base.model.vocab_size)
    load_tokens(base.data, tokenizer, progress=True)  # tokenize once; ranks memory-map the cache

    t = base.train
    where = f"two nodes over a {args.link} link (tbf on a veth pair)" if rate_bps else "one machine, loopback"
    print(f"{base.model.name}: seq_len {t.seq_len}, global batch {t.global_batch} sequences "
          f"({t.global_batch * t.seq_len} tokens/step), micro-batches of "
          f"{args.micro_batch_size or 'global batch / (dp x pp)'}, "
          f"clip {t.grad_clip:g}, gloo, 1 thread/rank, {where}; {args.rounds} rounds x {args.steps} "
          f"steps per implementation after {args.warmup} warm-up; 'ratrain' row: policy "
          f"{args.ratrain_policy}", flush=True)
    results = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, x in enumerate(layouts):
            cfg = cfgs[x]["baseline"]
            per_node = f", {x.world // 2} per node" if rate_bps else ""
            cores = len(os.sched_getaffinity(0))
            over = f"; {x.world} ranks on {cores} cores: oversubscribed" if x.world > cores else ""
            print(f"\n== {x.name}: {x.world} ranks{per_node}, {cfg.n_micro} micro-batches of "
                  f"{cfg.train.micro_batch_size} per replica{over} ==", flush=True)
            work = Path(tmp) / f"config{i}"
            work.mkdir()
            spec = {"layout": dataclasses.asdict(x),
                    "impls": impls[x][0], "skipped": impls[x][1],
                    "cfgs": {impl: c.to_dict() for impl, c in cfgs[x].items()},
                    "opts": {"steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
                             "bucket_mb": args.ddp_bucket_mb},
                    "result_path": str(work / "rank0.json"), "error_dir": str(work / "errors")}
            t0 = time.perf_counter()
            if rate_bps:
                spec_path = work / "spec.json"
                spec_path.write_text(json.dumps(spec))
                try:
                    net.run(x.world // 2, [str(SCRIPT), "--worker", str(spec_path)], 29500 + i,
                            work, cwd=REPO)
                except RuntimeError:
                    reports = [json.loads(p.read_text()) for p in (work / "errors").glob("rank_*.json")]
                    if reports:
                        first = min(reports, key=lambda r: r["time"])
                        raise RankFailed(first["rank"], f"{first['type']}: {first['message']}",
                                         first["user_error"]) from None
                    raise
            else:
                launch_local(x.world, rank_main, (spec,), error_dir=work / "errors", threads=1)
            raw = json.loads((work / "rank0.json").read_text())
            # what rank 0 said of the auto row's choice (two-node mode: in node A's log)
            said = [line for line in (work / "node0.log").read_text().splitlines()
                    if line.startswith(START_LINES)] if rate_bps else []
            for line in said:
                print(line)
            res = {"layout": {**dataclasses.asdict(x), "key": x.key, "name": x.name},
                   "n_micro": cfg.n_micro, "micro_batch_size": cfg.train.micro_batch_size,
                   "tokens_per_step": t.global_batch * t.seq_len,
                   "peer": raw["peer"], "wall_s": time.perf_counter() - t0,
                   "start_lines": said, **analyse(x, raw, cfg, rate_bps), **raw}
            for d in raw["implementations"]:
                if d["kind"] == "peer":
                    print(f"{d['name']}: {d['description']}")
            for impl, why in raw["skipped"].items():
                print(f"{impl}: skipped: {why}")
            print()
            print_layout(x, res)
            results.append(res)
    wall = time.perf_counter() - started

    print()
    print_overview(results)
    result = {
        "benchmark": "schedules",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(),
                                         *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "settings": {"model": args.model, "layers": base.model.n_layers, "seq_len": t.seq_len, "micro_batch_size": args.micro_batch_size,
                     "global_batch": t.global_batch, "tokens_per_step": t.global_batch * t.seq_len,
                     "grad_clip": t.grad_clip, "lr": t.lr, "seed": t.seed, "backend": "gloo",
                     "threads_per_rank": 1, "steps_per_round": args.steps, "rounds": args.rounds,
                     "warmup": args.warmup, "ratrain_policy": args.ratrain_policy,
                     "split": args.split, "groups": args.groups, "peer_zb": args.peer_zb,
                     "peer_sync": args.peer_sync, "ddp_bucket_mb": args.ddp_bucket_mb,
                     "link": args.link, "link_bits_per_s": rate_bps,
                     "timing": "perf_counter around each train step on rank 0",
                     "lower_bound": "the 1F1B bound: max(compute incl. the 1F1B bubble and the "
                                    "cores' share, from each stage's forward+backward per "
                                    "micro-batch measured alone; bytes crossing the link per "
                                    "direction / rate); see each config's lower_bound"},
        "configs": results,
        "wall_s": wall,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out} ({wall:.0f}s)")
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
