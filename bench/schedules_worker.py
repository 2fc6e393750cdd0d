"""One rank of bench/schedules.py: it builds every implementation of the driver's spec in one
process group, runs their warm-up steps and the interleaved rounds, times each step on rank 0,
then measures its stage's compute alone, and rank 0 writes the raw result the driver analyses
(bench/schedules_report.py). Started by the driver through `launch_local` (loopback) or, in
two-node mode, by torchrun running `bench/schedules.py --worker SPEC` (`worker_main`)."""

from __future__ import annotations

import gc
import json
import os
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch import nn

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.data.tokenizer import load_tokenizer
from ratrain.models.llama import build_units, lm_loss
from ratrain.runtime.engine import PipelineEngine
from ratrain.schedule.grid import RankGrid
from ratrain.runtime.launch import exit_without_teardown
from ratrain.runtime.worker_errors import record_failure
from ratrain.runtime.process_groups import init_groups
from ratrain.runtime.trace import Tracer
from ratrain.data.replica import make_data
from ratrain.training.prepare import plan_here

from peers import DDPPeer, PipelinePeer
from schedules_layout import Layout


def make_grid(layout: Layout) -> RankGrid:
    return RankGrid(layout.pp, layout.dp, order=layout.order)


def _step_categories(events, steps: range) -> list[dict[str, float]]:
    """Per traced step of `steps`: seconds inside each action category (F, B, U, WGS, ...)."""
    per: dict[int, dict[str, float]] = {}
    for step, name, t0, t1 in events:
        if step in steps:
            d = per.setdefault(step, defaultdict(float))
            d[name.rstrip("0123456789.")] += (t1 - t0) / 1e6
    return [dict(per[s]) for s in sorted(per)]


def _compute_alone(cfg: RunConfig, units: range, groups, batch, reps: int = 5) -> float:
    """Seconds of forward + backward of one micro-batch through this stage's units (fresh copies,
    one thread), each rank in turn while the others wait at a barrier: the compute time of a
    stage when nothing else shares the cores. The minimum of `reps` timings after one warm-up."""
    module = nn.Sequential(*build_units(cfg.model, cfg.train.seed, list(units)))
    x, y = batch
    last = groups.stage == groups.grid.pp - 1
    if groups.stage > 0:
        g = torch.Generator().manual_seed(groups.rank)
        x = torch.randn(*x.shape, cfg.model.dim, generator=g).requires_grad_()

    def once() -> float:
        t0 = time.perf_counter()
        out = module(x)
        if last:
            lm_loss(out, y).backward()
        else:
            out.backward(torch.ones_like(out))
        return time.perf_counter() - t0

    best = float("inf")
    for turn in range(groups.grid.world_size):
        dist.barrier()
        if turn == groups.rank:
            once()
            best = min(once() for _ in range(reps))
    dist.barrier()
    return best


def rank_main(spec: dict) -> None:
    _bench(spec)
    # Tear down once every rank is done with the groups and they are gone (as ratrain's
    # training loop does).
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def _make_peer(impl: dict, cfg: RunConfig, units: range, groups, opts: dict):
    clip = cfg.train.grad_clip
    if impl["schedule"] is None:
        return DDPPeer(cfg, groups, clip, opts["bucket_mb"])
    return PipelinePeer(cfg, units, groups, clip, impl["sync"], opts["bucket_mb"],
                        getattr(pipelining, impl["schedule"]))


def _make_peers(spec: dict, cfg: RunConfig, units: range, groups) -> tuple[dict, dict[str, str]]:
    """The spec's peers that torch accepts for this layout, and every skipped implementation
    (the spec's and those torch refuses) with why."""
    peers, skipped = {}, dict(spec["skipped"])
    for impl in (d for d in spec["impls"] if d["kind"] == "peer"):
        try:
            peers[impl["name"]] = _make_peer(impl, cfg, units, groups, spec["opts"])
        except ValueError as e:  # alike on every rank: it depends on pp and n_micro only
            skipped[impl["name"]] = f"torch's {impl['schedule']} refuses this layout: {e}"
    return peers, skipped


def _bench(spec: dict) -> None:
    layout = Layout(**spec["layout"])
    opts = spec["opts"]
    cfgs = {impl: RunConfig.from_dict(d) for impl, d in spec["cfgs"].items()}
    base = cfgs["baseline"]
    t = base.train
    groups = init_groups(make_grid(layout), "gloo")
    is_main = groups.rank == 0
    loader, _ = make_data(base, load_tokenizer(base.data.tokenizer), layout.dp, groups.replica)

    keep = max(opts["steps"], opts["warmup"], 1)
    tracers = {impl: Tracer(keep_steps=keep) for impl in cfgs}
    engines = {impl: PipelineEngine(cfg, plan_here(cfg, progress=cfg.parallel.schedule == AUTO_SCHEDULE),
                                    groups, tracers[impl])
               for impl, cfg in cfgs.items()}
    peers, skipped = _make_peers(spec, base, engines["baseline"].plan.stage_units[groups.stage],
                                 groups)
    steps_fn = {**{impl: (lambda b, s, e=e: e.train_step(b, t.lr, s).loss)
                   for impl, e in engines.items()},
                **{impl: (lambda b, s, p=p: p.train_step(b)) for impl, p in peers.items()}}
    run = [{**d, "description": peers[d["name"]].description} if d["name"] in peers else d
           for d in spec["impls"] if d["name"] in steps_fn]
    impls = [d["name"] for d in run]
    next_step = dict.fromkeys(impls, 0)
    tokens_per_step = t.global_batch * t.seq_len
    traced: dict[str, list[dict[str, float]]] = {impl: [] for impl in engines}

    def phase(impl: str, n: int, timed: bool):
        dist.barrier()
        if impl in tracers:
            tracers[impl].reset_origin()
        first = next_step[impl]
        times, losses = [], []
        for _ in range(n):
            step = next_step[impl]
            next_step[impl] += 1
            batches = loader.step_batches(step)
            t0 = time.perf_counter()
            loss = steps_fn[impl](batches, step)
            times.append(time.perf_counter() - t0)
            losses.append(loss)
        dist.barrier()
        if timed and impl in tracers:
            traced[impl] += _step_categories(tracers[impl].events(), range(first, first + n))
        return times, losses

    warm = {}
    for impl in impls:
        times, losses = phase(impl, opts["warmup"], timed=False)
        warm[impl] = {"step_times_s": times, "losses": losses}

    rounds = []
    for r in range(opts["rounds"]):
        order = impls if r % 2 == 0 else impls[::-1]
        row = {"round": r + 1, "order": list(order)}
        for impl in order:
            times, losses = phase(impl, opts["steps"], timed=True)
            row[impl] = {"tokens_per_s": tokens_per_step * len(times) / sum(times),
                         "step_times_s": times, "losses": losses}
        if is_main:
            print(f"  round {r + 1}/{opts['rounds']}: "
                  + ", ".join(f"{impl} {row[impl]['tokens_per_s']:.0f}" for impl in impls)
                  + " tok/s", flush=True)
        rounds.append(row)

    alone = _compute_alone(base, engines["baseline"].stage.units, groups, loader.step_batches(0)[0])
    mine = {"rank": groups.rank, "stage": groups.stage, "replica": groups.replica,
            "n_params": sum(p.numel() for p in engines["baseline"].stage.master_params()),
            "cores": len(os.sched_getaffinity(0)),
            "compute_alone_per_micro_batch_s": alone, "trace_per_step_s": traced}
    ranks = [None] * layout.world
    dist.all_gather_object(ranks, mine)
    if is_main:
        Path(spec["result_path"]).write_text(json.dumps({
            "rounds": rounds,
            "warmup": warm,
            "ranks": ranks,
            "implementations": run,
            "skipped": skipped,
            "peer": peers["peer"].description,
            "plans": {impl: e.plan.to_dict() for impl, e in engines.items()},
        }))


def worker_main(spec_path: str) -> None:
    """One rank started by torchrun (two-node mode)."""
    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    code = 0
    try:
        rank_main(spec)
    except BaseException as e:  # noqa: BLE001 - reported to the driver, then exit 1
        record_failure(Path(spec["error_dir"]), int(os.environ.get("RANK", -1)), e)
        traceback.print_exc()
        code = 1
    exit_without_teardown(code)
