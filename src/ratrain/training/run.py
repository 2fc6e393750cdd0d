"""`train()`, the one entry point: the checked plan, the run directory, then the ranks.

With pp = dp = 1 the run goes on in this process: the plain single-process engine, or the
executor when the run asks for what only the executor does (views, offload, recompute, float16,
a plan file). Otherwise it starts pp x dp local processes (or, under torchrun, is already one of
them) and every rank runs `rank_main` with its own stage of the pipeline plan.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from ratrain import checkpoint
from ratrain.config import RunConfig, write_whole
from ratrain.runtime import timed_comm
from ratrain.runtime.engine import LocalEngine, PipelineEngine, needs_executor
from ratrain.data.replica import Stream
from ratrain.errors import Interrupted
from ratrain.models.hf_start import check_init_from, overridden_fields, weights_line
from ratrain.models.params import count_params
from ratrain.runtime.launch import (STOP_SIGNALS, ask_to_stop_on_signals, launch_local,
                                    sigterm_as_ctrl_c, stop_signal, stopped_how)
from ratrain.runtime.torchrun_env import under_torchrun
from ratrain.runtime.process_groups import init_groups, join_world, stop_together
from ratrain.runtime.trace import Tracer
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.outer_sync import EVERY_STEP
from ratrain.schedule.plan import PipelinePlan
from ratrain.setup.plan_file import SEARCHED_PLAN
from ratrain.training.agreed_config import agreed_config
from ratrain.training.agreed_plan import agreed, agreed_checkpoint, agreed_stream
from ratrain.training.disk_room import check_room_together
from ratrain.training.loop import Loop
from ratrain.training.prepare import (is_distributed, meetings_note, plan_here, prepare,
                                      threads_in_this_process, threads_per_rank, warmup_note)
from ratrain.training.run_dir import checkpoints_of, kept_files, open_run_dir, saves_checkpoints
from ratrain.training.run_tokenizer import keep_run_tokenizer
from ratrain.training.shared_dir import agreed_local_checkpoint, shared_by


def train(cfg: RunConfig, run_dir: Path | None, *, resume: bool = False, progress: bool = True,
          trace: bool = True, plan_data: dict | None = None,
          resume_from: Path | None = None) -> dict:
    """Train as configured; returns the run summary (also written to run_dir/summary.json).
    With no run_dir, a new one under runs/ is made once the input has been checked. `resume`
    continues from the newest checkpoint of run_dir that verifies: `resume_from`, where the
    caller has chosen it already (run_dir.resume_point; its files are not hashed again).
    `plan_data`: the contents of cfg's plan file, where the caller has read it already
    (setup.read_plan_file).

    The plan is built (or read) here once and handed to the ranks. Under torchrun this runs on
    every rank (each builds the plan itself) and only rank 0 returns the summary (others: {}).
    Raises Interrupted when Ctrl-C stopped the run."""
    plan, stream = prepare(cfg, progress, plan_data)
    _say_the_weights(cfg, resume, progress)
    plan_dict = plan.to_dict() if plan else None
    opened = open_run_dir(run_dir, cfg, resume, resume_from)
    run_dir, ckpt = opened.path, opened.resume_from
    notes = [meetings_note(cfg, checkpoint.load_meta(ckpt)["step"] if ckpt else 0),
             progress and warmup_note(cfg.train)]  # (a note on a choice made, with progress)
    for note in filter(None, notes) if int(os.environ.get("RANK", 0)) == 0 else ():
        print(note, file=sys.stderr, flush=True)
    _say_the_resume(cfg, ckpt, progress)
    if cfg.parallel.plan_file == SEARCHED_PLAN:  # its plan file is the run's copy
        cfg.parallel.plan_file = str((run_dir / "plan.json").resolve())
    world = cfg.parallel.pp * cfg.parallel.dp
    summary_path = run_dir / "summary.json"
    keep_run_tokenizer(run_dir, cfg, resumed=ckpt is not None)
    # a resumed run that fails before its first step leaves the directory's files as they were
    kept = kept_files(run_dir) if ckpt and int(os.environ.get("RANK", 0)) == 0 else None
    if int(os.environ.get("RANK", 0)) == 0:  # under torchrun every rank gets here
        summary_path.unlink(missing_ok=True)  # an earlier part of a resumed run's: not this one
        (run_dir / "trace.json").unlink(missing_ok=True)  # nor its trace (this part may have none)
        # a plan file's whole (what it was made for, its prediction), where it has one
        _write_run_files(run_dir, cfg, plan_data if plan_data is not None else plan_dict)
    args = (cfg, str(run_dir), str(ckpt) if ckpt else None, progress, trace, plan_dict, stream)
    in_this_process = under_torchrun() or world == 1
    try:
        if in_this_process:  # (a torchrun worker's SIGTERM is its agent's: sigterm_as_ctrl_c)
            with _computing_on(threads_in_this_process(cfg)), \
                    nullcontext() if under_torchrun() else sigterm_as_ctrl_c():
                asked_by = rank_main(*args, agree=under_torchrun())
                # a rank that learnt of the stop from the others' has no signal of its own
                stopped = (stop_signal() or asked_by) if asked_by else None
        else:
            stopped = launch_local(world, rank_main, args, error_dir=run_dir / "errors",
                                   threads=threads_per_rank(cfg, world),
                                   checkpoint_on_interrupt=cfg.train.checkpoint_on_interrupt)
    except BaseException as e:
        if kept is not None:
            kept.restore_unless_stepped(checkpoint.load_meta(ckpt)["step"])
        if isinstance(e, KeyboardInterrupt) or (isinstance(e, Interrupted) and not e.kept_said):
            how = (str(e) if isinstance(e, Interrupted) else
                   stopped_how(getattr(e, "signum", signal.SIGINT)))  # (SIGTERM's: _Terminated)
            raise Interrupted(f"{how}; {_what_is_kept(cfg, opened.checkpoints, run_dir)}",
                              kept_said=True, signum=getattr(e, "signum", signal.SIGINT)) from None
        raise
    finally:  # every rank is gone: what an unfinished save left is of no use (under torchrun
        if not under_torchrun():  # the other ranks may still be writing theirs)
            checkpoint.remove_partials(opened.checkpoints)
    if stopped and not summary_path.exists():
        saved = checkpoint.complete_dirs(opened.checkpoints)[-1]  # this run's, just published
        step = checkpoint.load_meta(saved)["step"]
        raise Interrupted(f"{stopped_how(stopped)} after step {step}; saved checkpoint {saved} "
                          f"(continue with --resume {run_dir})", kept_said=True, signum=stopped)
    if int(os.environ.get("RANK", 0)) != 0 or not summary_path.exists():
        return {}
    return json.loads(summary_path.read_text())


def _say_the_weights(cfg: RunConfig, resume: bool, progress: bool) -> None:
    """A new run's train.init_from checked (before its directory is made), and said by rank 0:
    the model fields set otherwise than its config.json, and (with progress) where the
    weights come from. A resume's are its checkpoint's."""
    if resume:
        return
    check_init_from(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        for line in [*overridden_fields(cfg), progress and weights_line(cfg)]:
            if line:
                print(line, file=sys.stderr, flush=True)


def _say_the_resume(cfg: RunConfig, ckpt: Path | None, progress: bool) -> None:
    """Which checkpoint a resume goes on from, said by rank 0 with progress (until 2026-12-03
    only where a newer one was skipped). What was asked, so not a note said either way
    (--no-progress): a skipped checkpoint's line names the one taken."""
    if ckpt and progress and int(os.environ.get("RANK", 0)) == 0:
        print(f"resuming from {ckpt.name} (step {checkpoint.load_meta(ckpt)['step']} of "
              f"{cfg.train.steps})", file=sys.stderr, flush=True)


def _what_is_kept(cfg: RunConfig, checkpoints, run_dir: Path) -> str:
    """What a run stopped by Ctrl-C keeps, said after "interrupted" ("the run keeps its
    checkpoints up to the last completed save" was said of runs that had none), and where it
    has none, why."""
    kept = checkpoint.what_is_kept(checkpoints, run_dir)
    if checkpoint.complete_dirs(checkpoints):
        return kept
    if not cfg.train.checkpoints:
        return kept + " (--no-checkpoints)"
    # (with it, a second Ctrl-C dropped the save it made)
    return kept + " yet" + ("" if cfg.train.checkpoint_on_interrupt else
                            " (--checkpoint-on-interrupt saves one at Ctrl-C)")


@contextmanager
def _computing_on(threads: int | None):
    """`threads` (prepare.threads_in_this_process; None: this process's own) for a run in this
    process, and back to the caller's count after it: a program that trains in its own
    process keeps its threads."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def rank_main(cfg: RunConfig, run_dir: str, resume_from: str | None, progress: bool,
              trace: bool, plan_dict: dict | None = None, stream: Stream | None = None,
              agree: bool = False) -> int | None:
    """One rank's run, from the checkpoint `resume_from` if given (verified by the caller:
    run_dir.resume_point; its files are not hashed again here, except on torchrun's ranks
    other than 0, which take rank 0's and hash their own units'); returns the signal that
    stopped it early (--checkpoint-on-interrupt: after saving a checkpoint), agreed by every
    rank (Loop.run), or None. `plan_dict`: the plan `prepare` made (PipelinePlan.to_dict),
    already checked; None where the run needs none (`train` passes what prepare returned), or
    where a caller of its own leaves it to be made here from the config. `agree`: every rank
    made its own plan (torchrun), so once the world is joined they take rank 0's schedule
    (training/agreed_plan.py)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    distributed = is_distributed(cfg)
    verified = True  # resume_from's files hashed already (not so on torchrun's other ranks)
    rank = int(os.environ.get("RANK", 0))
    if plan_dict is not None:
        plan = PipelinePlan.from_dict(plan_dict)
    else:
        plan = plan_here(cfg) if distributed or needs_executor(cfg) else None
    built = _building(cfg, plan, rank, progress)
    if distributed:
        p = cfg.parallel
        if agree:  # a node that stopped before training says why (cli._tell_the_other_ranks)
            join_world(p.backend, p.comm_timeout_s)
            stop_together(None)
            agreed_config(cfg)  # before the groups, which some settings shape (pp, sync)
        groups = init_groups(RankGrid(p.pp, p.dp, p.rank_order), p.backend, p.comm_timeout_s,
                             plan.shard_group, bool(plan.tied_ends),
                             host_outer_sync=plan.state_home == "host" and plan.sync != EVERY_STEP,
                             paced=plan.sync != EVERY_STEP,
                             island_size=plan.grad_sync_dp if plan.sync != EVERY_STEP else 1)
        share = None
        if agree:
            plan, share, resume_from, verified = _agree_across_nodes(cfg, plan, groups, run_dir,
                                                                     rank, resume_from)
            stream = agreed_stream(cfg, rank, stream)  # its node's first rank's
        tracer = Tracer() if trace else None
        engine = PipelineEngine(_built_from(cfg, resume_from), plan, groups, tracer)
        if share and share.node_local:  # rank 0's choice, where every node's directory has it
            written = {u for r in share.ranks for u in plan.stage_units[groups.grid.coords(r)[0]]}
            resume_from, verified = agreed_local_checkpoint(
                checkpoint.root(checkpoints_of(run_dir, cfg)), rank, resume_from,
                engine.checkpoint_units(), written, p.files_of(groups.replica), p.comm_timeout_s,
                groups.device)
    else:
        groups, tracer, share = None, None, None
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if plan:
            tracer = Tracer() if trace else None
            engine = PipelineEngine(_built_from(cfg, resume_from), plan, None, tracer,
                                    device=device)
        else:
            engine = LocalEngine(_built_from(cfg, resume_from), device)
    built()
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    if cfg.train.checkpoint_on_interrupt:
        ask_to_stop_on_signals()
    try:
        # A failure propagates without destroy_process_group: that is collective and would wait
        # on ranks that may be stuck or gone. The launcher (ours or torchrun) takes them down.
        loop = Loop(cfg, run_dir, engine, groups, tracer, rank, progress, plan, share, stream)
        stopped = loop.run(Path(resume_from) if resume_from else None, verified)
    finally:
        for signum, handler in previous.items():  # (None: not set from Python)
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if distributed:
        del engine, groups, loop  # the groups must be gone before the backend they belong to
        _shut_down_together(cfg.parallel.comm_timeout_s)
    return stopped


def _agree_across_nodes(cfg: RunConfig, plan: PipelinePlan, groups, run_dir: Path, rank: int,
                        resume_from: str | None):
    """Under torchrun, where every rank made its own plan and found its own checkpoint (its
    settings agreed before the groups: agreed_config): rank 0's schedule; who shares the
    checkpoint directory, and room for what each will hold; in a shared directory rank 0's
    checkpoint. Returns (plan, share, resume_from, verified); with node-local directories the
    checkpoint is agreed on once the engine is built."""
    p, verified = cfg.parallel, True
    plan, share = agreed(cfg, plan, rank), None
    checkpoints = checkpoints_of(run_dir, cfg)
    if saves_checkpoints(cfg) or any(timed_comm.all_gather_object(
            resume_from is not None, p.comm_timeout_s, "start of training",
            "the resume's agreement", groups.device)):
        share = shared_by(checkpoint.root(checkpoints), rank, p.pp * p.dp, p.comm_timeout_s,
                          groups.device)
    if saves_checkpoints(cfg):
        check_room_together(cfg, checkpoints, cfg.train.checkpoint_dir or run_dir, share,
                            groups.grid, plan.stage_units, rank, resume_from is not None,
                            groups.device)
    if share and share.node_local:
        if rank == share.publisher and rank != 0:  # a resume on its node reads them
            _write_run_files(run_dir, cfg, plan.to_dict())
    elif resume_from:
        resume_from, verified = agreed_checkpoint(resume_from, rank)
    return plan, share, resume_from, verified


def _write_run_files(run_dir: Path, cfg: RunConfig, plan: dict | None) -> None:
    """The run's config.yaml and plan.json, which a resume reads (train_cmd)."""
    cfg.save(run_dir / "config.yaml")
    if plan:
        write_whole(run_dir / "plan.json", json.dumps(plan, indent=2))


SAYS_BUILDING_FROM = 500_000_000
"""Parameters from which rank 0 says that it builds the model: a 7B model's units and state
took minutes to build with nothing on the screen."""


def _built_from(cfg: RunConfig, resume_from: str | None) -> RunConfig:
    """The config the engine builds the model from: a resumed run's weights are its
    checkpoint's, so the Hugging Face directory it started from is not read (it may have moved
    since, or the resume runs in another working directory: refused until 2026-11-29)."""
    if not (resume_from and cfg.train.init_from):
        return cfg
    built = copy.deepcopy(cfg)
    built.train.init_from = None
    return built


def _building(cfg: RunConfig, plan: PipelinePlan | None, rank: int, progress: bool):
    """Say (rank 0, with progress, a large model) that the model is being built; returns what
    says when it is built."""
    params = count_params(cfg.model)
    if not (progress and rank == 0 and params >= SAYS_BUILDING_FROM):
        return lambda: None
    stage = ""
    if plan and plan.pp > 1:
        units = plan.stage_units[0]
        stage = f"; this rank: stage 0 of {plan.pp}, units {units.start}-{units.stop - 1}"
    print(f"building {cfg.model.name} ({params / 1e9:.2f}B parameters{stage}) ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    return lambda: print(f"built in {time.perf_counter() - start:.1f} s", file=sys.stderr,
                         flush=True)


def _shut_down_together(timeout_s: float) -> None:
    """Tear the process groups down once every rank is done with them: a rank that closes its
    connections while a peer still uses them can take the peer down."""
    timed_comm.barrier(timeout_s, "end of run", "the last barrier")
    gc.collect()
    dist.destroy_process_group()
