"""The implementations bench/schedules.py runs on a layout, as the dicts the result records and
bench/schedules_worker.py builds from: name, label, kind ("engine": a ratrain PipelineEngine, or
"peer": torch), split_backward, and its schedule settings; and the RunConfig of each engine."""

from __future__ import annotations

from ratrain.config import AUTO_SCHEDULE, DataConfig, ParallelConfig, RunConfig, TrainConfig
from ratrain.models.presets import get_preset
from ratrain.schedule.plan_rules import SPLIT_SCHEDULES

from schedules_layout import Layout

PEER_ZB = "peer-zb"
ZERO_BUBBLE = "ScheduleInterleavedZeroBubble"  # torch's, with one stage per rank


def engine(name: str, label: str, policy: str, schedule: str = "1f1b",
           weight_grad: str | None = None, group: int | None = None) -> dict:
    """A ratrain PipelineEngine implementation, as the result records it (`group`: its
    unit-major micro-batch group; None: 1, or auto's choice)."""
    return {"name": name, "label": label, "kind": "engine", "policy": policy,
            "schedule": schedule, "weight_grad": weight_grad, "group": group,
            "split_backward": schedule in SPLIT_SCHEDULES}


def peer(name: str, schedule: str | None, sync: str, layout: Layout) -> dict:
    """A torch implementation: `schedule` a class of torch.distributed.pipelining (None: DDP at
    pp = 1), `sync` how its replicas average gradients (bench/peers.py)."""
    with_sync = {"ddp": " + DDP", "allreduce": " + all_reduce"}[sync] if layout.dp > 1 else ""
    what = f"{schedule}{with_sync}" if schedule else "DDP"
    return {"name": name, "label": f"{name}: torch {what}", "kind": "peer", "schedule": schedule,
            "sync": sync, "split_backward": schedule == ZERO_BUBBLE}


def implementations(args, layout: Layout) -> tuple[list[dict], dict[str, str]]:
    """The layout's implementations in round order, and those skipped with why."""
    impls = [engine("ratrain", f"ratrain (policy {args.ratrain_policy})", args.ratrain_policy),
             engine("baseline", "ratrain baseline", "baseline")]
    if args.auto:
        impls.append(engine("auto", "ratrain defaults (--schedule auto)", "ratrain", AUTO_SCHEDULE))
    impls += [engine(f"zbh1-{w}", f"ratrain zbh1, weight grads {w}", "ratrain", "zbh1", w)
              for w in args.split]
    impls += [engine(f"1f1b-g{g}", f"ratrain 1f1b in groups of {g}", "ratrain", group=g)
              for g in args.groups]
    if layout.pp == 1:
        impls.append(peer("peer", None, "ddp", layout))
        return impls, {PEER_ZB: "pp=1: no pipeline to schedule"} if args.peer_zb else {}
    impls.append(peer("peer", "Schedule1F1B", args.peer_sync, layout))
    if args.peer_zb:
        # all_reduce whatever --peer-sync says: DDP misses the split weight backward (peers.py)
        impls.append(peer(PEER_ZB, ZERO_BUBBLE, "allreduce", layout))
    return impls, {}


def make_config(args, layout: Layout, impl: dict) -> RunConfig:
    """The config of an engine implementation (`engine`)."""
    model = get_preset(args.model)
    if args.layers:
        model.n_layers = args.layers
        model.name = f"{args.model}-{args.layers}L"
    cfg = RunConfig(
        model=model,
        data=DataConfig(),  # byte-tokenized standard library
        train=TrainConfig(
            seq_len=args.seq_len,
            # default: pp micro-batches per replica, the fewest that fill the pipeline (a unit's
            # gradient is final after the last one's backward, so fewer hide more of the sync)
            micro_batch_size=args.micro_batch_size or max(1, args.global_batch // layout.world),
            global_batch=args.global_batch,
            steps=args.warmup + args.steps * args.rounds,
            grad_clip=args.clip,
            eval_batches=0,
            seed=args.seed,
        ),
        # the schedule each row names; `auto` only in the row of that name
        parallel=ParallelConfig(pp=layout.pp, dp=layout.dp, policy=impl["policy"],
                                schedule=impl["schedule"], weight_grad=impl["weight_grad"],
                                micro_batch_group=impl.get("group"),
                                backend="gloo", threads_per_rank=1, rank_order=layout.order),
    )
    cfg.validate()
    return cfg
