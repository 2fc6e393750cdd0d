"""Before any run directory or process exists: this machine as the setup stage sees it, the
checked plan on it, and the checks of the data."""

from __future__ import annotations

import os
import sys

import torch

from ratrain.config import RunConfig, TrainConfig
from ratrain.data.replica import Stream, check_data
from ratrain.cpu_features import bf16_matmul_flag
from ratrain.host_cores import usable_cores
from ratrain.host_memory import available_host_bytes
from ratrain.runtime.engine import needs_executor
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.runtime.process_groups import pick_backend
from ratrain.schedule.outer_sync import parse_sync
from ratrain.schedule.plan import PipelinePlan
from ratrain.setup import Machine, check_memory_fits, run_plan
from ratrain.training import link_profile


def this_machine(cfg: RunConfig) -> Machine:
    """Where cfg runs: a GPU (NCCL) or not, the processes torchrun started, on a GPU its name
    and memory (what --schedule auto simulates on and weighs against), and across nodes, where
    the schedule is auto and no profile says what the links are, the links measured now."""
    links = None
    if link_profile.wants_probe(cfg):  # collective: every rank of the run measures
        links = link_profile.measure(cfg)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else None
    memory = {"host_available_bytes": available_host_bytes(), "local_ranks": _local_ranks(),
              "threads_per_rank": _threads_here(cfg)}
    if pick_backend(cfg.parallel.backend) != "nccl":
        return Machine(world=world, links=links, cpu_bf16_flag=bf16_matmul_flag(), **memory)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return Machine(host_is_separate=True, world=world, device_name=props.name,
                   memory_bytes=props.total_memory, links=links, **memory)


def threads_per_rank(cfg: RunConfig, ranks_here: int) -> int:
    """CPU threads of each of the `ranks_here` ranks that share this machine's cores: --threads,
    else the cores split among them, at least one each (as sim/shared_cores.threads_of_rank
    prices them). One thread a rank, the default until 2026-11-28 on a CPU, left all but
    `ranks_here` cores of a large machine idle; on GPUs the ranks' CPU work is host state's
    (AdamW, folds, norms), bound by memory bandwidth that one core cannot reach."""
    return cfg.parallel.threads_per_rank or max(1, usable_cores() // max(1, ranks_here))


def threads_in_this_process(cfg: RunConfig) -> int | None:
    """The threads a run in this process (one rank, or torchrun's) computes on, None where it
    keeps this process's (torch's default of every core, or OMP_NUM_THREADS): --threads; under
    torchrun with several ranks on this node, the cores split among them as for the ranks
    ratrain launches, unless OMP_NUM_THREADS says other than the 1 that torchrun sets for
    every such rank (a user who wants one thread a rank says --threads 1)."""
    if cfg.parallel.threads_per_rank:
        return cfg.parallel.threads_per_rank
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if under_torchrun() else 1
    if local > 1 and os.environ.get("OMP_NUM_THREADS", "1").strip() == "1":
        return threads_per_rank(cfg, local)
    return None


def _threads_here(cfg: RunConfig) -> int:
    """The threads each rank of cfg's run will compute on, for the simulation of its
    schedule's candidates: a run in this process, threads_in_this_process's or this process's
    own; ranks launched here, threads_per_rank's."""
    world = cfg.parallel.pp * cfg.parallel.dp
    if under_torchrun() or world == 1:
        return threads_in_this_process(cfg) or torch.get_num_threads()
    return threads_per_rank(cfg, world)


def _local_ranks() -> tuple[int, ...] | None:
    """Under torchrun, the ranks of this node (its agent gives a node consecutive ranks);
    None where the run starts its own, all here."""
    if not under_torchrun():
        return None
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    first = rank - local
    return tuple(range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", 1))))


def plan_here(cfg: RunConfig, plan_data: dict | None = None, progress: bool = False,
              machine: Machine | None = None) -> PipelinePlan:
    """The checked plan of cfg on this machine (setup.run_plan; `machine`: this_machine's, where
    already known); with `progress`, rank 0 says why the schedule it chose was chosen."""
    says = progress and int(os.environ.get("RANK", 0)) == 0
    return run_plan(cfg, machine or this_machine(cfg), plan_data=plan_data,
                    say=_say if says else None)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def is_distributed(cfg: RunConfig) -> bool:
    """More than one rank: pp x dp local processes, or torchrun's."""
    return cfg.parallel.pp * cfg.parallel.dp > 1 or under_torchrun()


def prepare(cfg: RunConfig, progress: bool = True, plan_data: dict | None = None
            ) -> tuple[PipelinePlan | None, Stream | None]:
    """Everything that can fail because of the user's input: the setup stage's checked plan
    (returned; None for a single process that the plain engine runs), its fit to this
    machine's memory (setup/memory_fit.py), then the data (data.check_data: the stream it
    checked, returned, which the ranks read; None on a torchrun node's other ranks)."""
    machine = this_machine(cfg)
    plan = plan_here(cfg, plan_data, progress, machine)
    check_memory_fits(cfg, plan, machine)
    keep = is_distributed(cfg) or needs_executor(cfg)
    first = int(os.environ.get("RANK", 0)) == 0
    asked, ranks = cfg.parallel.threads_per_rank, len(_local_ranks() or range(
        cfg.parallel.pp * cfg.parallel.dp))
    cores = usable_cores()
    if first and asked and pick_backend(cfg.parallel.backend) == "gloo" and asked * ranks > cores:
        print(f"--threads {asked} x {ranks} rank(s) here on {cores} cores: the threads "
              f"outnumber the cores and wait on each other (slower steps); leave --threads out "
              f"to split the cores among the ranks", file=sys.stderr, flush=True)
    stream = check_data(cfg, progress and first,
                        first_here=int(os.environ.get("LOCAL_RANK", 0)) == 0, first=first)
    return (plan if keep else None), stream


def meetings_note(cfg: RunConfig, done: int = 0) -> str | None:
    """Where a --sync diloco run (resumed after step `done`) meets at most twice in the steps
    it has left, the line that says when: the outer syncs fall on the run's steps H, 2H, ...
    and its last, counted from step 0 (a resume from step 4 under diloco:4 over 6 steps meets
    once, at step 6, where the note said "twice, after step 4" until 2026-12-02)."""
    outer, steps = parse_sync(cfg.parallel.sync), cfg.train.steps
    if outer is None or done >= steps or 2 * outer.every <= steps - done:
        return None
    meets = list(range((done // outer.every + 1) * outer.every, steps + 1, outer.every)[:2])
    if steps not in meets:
        meets.append(steps)
    when = ("once, at the last step" if len(meets) == 1 else
            f"twice, after step {meets[0]} and at the last")
    over = f"over steps {done + 1}-{steps}" if done else f"over {steps} steps"
    return (f"--sync {cfg.parallel.sync} {over}: the replicas meet {when} (each trains alone "
            "until then); a smaller H syncs them more often")


def warmup_note(t: TrainConfig) -> str | None:
    """Where the warmup outlasts the run (the default 30 steps, under a --steps 10), the lr
    never reaches --lr, which its help calls the peak: said at the start (until 2026-12-04 the
    lr was held to a third of it without a word). A warmup of exactly the run's steps reaches
    it at the last step."""
    if t.warmup_steps <= t.steps:
        return None
    from ratrain.runtime.optim import lr_at

    return (f"note: the lr warms up over {t.warmup_steps} steps, and the run has {t.steps}: "
            f"it reaches {lr_at(t.steps - 1, t):.3g} of --lr {t.lr:g} (--warmup-steps N sets "
            "the warmup)")
