"""The training loop: data -> engine -> steps -> metrics, validation, checkpoints, trace, plot.

`train()` is the one entry point. With pp = dp = 1 it runs in this process: the plain
single-process engine, or the executor when the run asks for what only the executor does (views,
offload, recompute, float16, a plan file). Otherwise it starts pp x dp local processes (or, under
torchrun, is already one of them) and every rank runs `rank_main` with its own stage of the
pipeline plan.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from ratrain import checkpoint
from ratrain.checkpoint import rng
from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.data.loader import MicroBatchLoader, eval_batches
from ratrain.data.tokenizer import check_fits, load_tokenizer
from ratrain.data.tokens import check_token_ids, load_tokens, split_train_val
from ratrain.errors import UserError
from ratrain.setup.layout import check_config, check_plan, plan_for_config, resolve_schedule
from ratrain.setup.plan_file import load_plan
from ratrain.runtime.process_memory import RssGrowth
from ratrain.training.metrics import MetricsLog, StepExtras, plot_loss
from ratrain.runtime.optim import lr_at
from ratrain.runtime.engine import LocalEngine, PipelineEngine
from ratrain.schedule.grid import RankGrid
from ratrain.training.run_dir import check_run_dir, new_run_dir, resume_point
from ratrain.runtime import timed_comm
from ratrain.runtime.launch import (Interrupted, ask_to_stop_on_sigint, launch_local,
                                    stop_requested, under_torchrun)
from ratrain.runtime.process_groups import init_groups, pick_backend
from ratrain.schedule.plan import PipelinePlan
from ratrain.runtime.trace import Tracer, write_chrome_trace


class TrainingDiverged(UserError):
    """The loss stopped being a finite number; the run ends with the last good checkpoint kept."""


def computes_on_cuda(cfg: RunConfig) -> bool:
    return pick_backend(cfg.parallel.backend) == "nccl"


def plan_for(cfg: RunConfig, plan_data: dict | None = None) -> PipelinePlan:
    """The pipeline plan of this config: its plan file's (`plan_data`: the file's contents,
    where already read), or the one its flags ask for on this machine's device
    (layout.plan_for_config); either checked by the rule of what can run (runnable.py)."""
    cuda = computes_on_cuda(cfg)
    if cfg.parallel.plan_file:
        plan = load_plan(cfg, plan_data)
        check_plan(plan, cfg, host_is_separate=cuda)
        return plan
    return plan_for_config(cfg, host_is_separate=cuda)


def needs_executor(cfg: RunConfig) -> bool:
    """Whether a single-process run needs the executor rather than the plain engine (which
    runs 1F1B's order, keeping everything, in fp32)."""
    p = cfg.parallel
    return bool(p.plan_file or p.activation_per_stage != ["keep"] or cfg.train.dtype != "float32"
                or p.state_home != "device" or p.schedule not in ("1f1b", AUTO_SCHEDULE)
                or p.weight_grad is not None)


def make_data(cfg: RunConfig, tokenizer, dp: int, replica: int, progress: bool = False):
    """This replica's training loader and validation micro-batches."""
    t = cfg.train
    tokens = load_tokens(cfg.data, tokenizer, progress=progress)
    train_tokens, val_tokens = split_train_val(tokens, cfg.data.val_fraction)
    loader = MicroBatchLoader(train_tokens, t.seq_len, t.global_batch, t.micro_batch_size,
                              dp_size=dp, dp_rank=replica, seed=t.seed)
    val = (eval_batches(val_tokens, t.seq_len, t.micro_batch_size, t.eval_batches, dp, replica)
           if t.eval_batches > 0 else [])
    return loader, val


def prepare(cfg: RunConfig, progress: bool = True,
            plan_data: dict | None = None) -> PipelinePlan | None:
    """Everything that can fail because of the user's input, checked before any run directory or
    process exists: the config, whether it can run here (runnable.py: the one rule the planner
    and the CLI apply too), the tokenizer against the model, the data, the pipeline plan
    (returned; None for a single process; a plan file's from `plan_data` where already read).
    Tokenizes the data once (cached), so that ranks only memory-map the cached file."""
    cfg.validate()
    cuda = computes_on_cuda(cfg)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else None
    plan = None
    if cfg.parallel.plan_file:  # the layout is the plan's: the rule checks the plan
        plan = load_plan(cfg, plan_data)
        check_plan(plan, cfg, host_is_separate=cuda, world=world)
    else:
        check_config(cfg, host_is_separate=cuda, world=world)
        _choose_schedule(cfg, cuda, progress)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_fits(tokenizer, cfg.model.vocab_size)
    if str(cfg.data.path).endswith(".bin"):
        check_token_ids(load_tokens(cfg.data, tokenizer), cfg.model.vocab_size)
    make_data(cfg, tokenizer, cfg.parallel.dp, 0, progress)  # too little data is a UserError
    distributed = cfg.parallel.pp * cfg.parallel.dp > 1 or under_torchrun()
    if plan is None and (distributed or needs_executor(cfg)):
        plan = plan_for_config(cfg, host_is_separate=cuda)
    return plan


def _choose_schedule(cfg: RunConfig, cuda: bool, progress: bool) -> None:
    """--schedule auto: the choice (layout.resolve_schedule) on this device's memory (a GPU's
    own; on a CPU the profile's budget), said at the start of the run with its progress (the
    summary and config.yaml record it either way)."""
    device_name = budget = None
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        device_name, budget = props.name, props.total_memory
    choice = resolve_schedule(cfg, cuda, budget=budget, device_name=device_name)
    if progress and choice and choice.candidates and int(os.environ.get("RANK", 0)) == 0:
        print(choice.why, file=sys.stderr, flush=True)


def train(cfg: RunConfig, run_dir: Path | None, *, resume: bool = False, progress: bool = True,
          trace: bool = True, plan_data: dict | None = None) -> dict:
    """Train as configured; returns the run summary (also written to run_dir/summary.json).
    With no run_dir, a new one under runs/ is made once the input has been checked. `resume`
    continues from the newest checkpoint of run_dir that verifies. `plan_data`: the contents
    of cfg's plan file, where the caller has read it already (layout.read_plan_file).

    The plan is built (or read) here once and handed to the ranks. Under torchrun this runs on
    every rank (each builds the plan itself) and only rank 0 returns the summary (others: {}).
    Raises Interrupted when Ctrl-C stopped the run."""
    plan = prepare(cfg, progress, plan_data)
    plan_dict = plan.to_dict() if plan else None
    check_run_dir(run_dir or Path("runs"), cfg)
    ckpt = resume_point(Path(run_dir), cfg) if resume else None
    run_dir = Path(run_dir) if run_dir else new_run_dir("runs", cfg.model.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    world = cfg.parallel.pp * cfg.parallel.dp
    summary_path = run_dir / "summary.json"
    if int(os.environ.get("RANK", 0)) == 0:  # under torchrun every rank gets here
        summary_path.unlink(missing_ok=True)  # an earlier part of a resumed run's: not this one
        cfg.save(run_dir / "config.yaml")
        if plan:
            (run_dir / "plan.json").write_text(json.dumps(plan_dict, indent=2))
    args = (cfg.to_dict(), str(run_dir), str(ckpt) if ckpt else None, progress, trace, plan_dict)
    if under_torchrun():
        stopped = rank_main(*args)
    else:
        try:
            if world == 1:
                stopped = rank_main(*args)
            else:
                stopped = launch_local(world, rank_main, args, error_dir=run_dir / "errors",
                                       threads=cfg.parallel.threads_per_rank,
                                       checkpoint_on_interrupt=cfg.train.checkpoint_on_interrupt)
        finally:  # every rank is gone: what an unfinished save left is of no use
            checkpoint.remove_partials(run_dir)
    if stopped and not summary_path.exists():
        saved = checkpoint.latest(run_dir)
        raise Interrupted(f"interrupted after step {checkpoint.load_meta(saved)['step']}; "
                          f"saved checkpoint {saved} (continue with --resume {run_dir})")
    if int(os.environ.get("RANK", 0)) != 0 or not summary_path.exists():
        return {}
    return json.loads(summary_path.read_text())


def rank_main(cfg_dict: dict, run_dir: str, resume_from: str | None, progress: bool,
              trace: bool, plan_dict: dict | None = None) -> bool:
    """One rank's run, from the checkpoint `resume_from` if given; returns whether Ctrl-C
    stopped it early (--checkpoint-on-interrupt: after saving a checkpoint). `plan_dict`: the
    plan `prepare` made (PipelinePlan.to_dict), already checked; None where the run needs none
    (`train` passes what prepare returned), or where a caller of its own leaves it to be made
    here from the config."""
    cfg = RunConfig.from_dict(cfg_dict)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    distributed = under_torchrun() or cfg.parallel.pp * cfg.parallel.dp > 1
    rank = int(os.environ.get("RANK", 0))
    if plan_dict is not None:
        plan = PipelinePlan.from_dict(plan_dict)
    else:
        plan = plan_for(cfg) if distributed or needs_executor(cfg) else None
    if distributed:
        p = cfg.parallel
        groups = init_groups(RankGrid(p.pp, p.dp, p.rank_order), p.backend, p.comm_timeout_s,
                             plan.shard_group)
        tracer = Tracer() if trace else None
        engine = PipelineEngine(cfg, plan, groups, tracer)
    else:
        groups, tracer = None, None
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if plan:
            tracer = Tracer() if trace else None
            engine = PipelineEngine(cfg, plan, None, tracer, device=device)
        else:
            engine = LocalEngine(cfg, device)
    previous = signal.getsignal(signal.SIGINT)
    if cfg.train.checkpoint_on_interrupt:
        ask_to_stop_on_sigint()
    try:
        # A failure propagates without destroy_process_group: that is collective and would wait
        # on ranks that may be stuck or gone. The launcher (ours or torchrun) takes them down.
        loop = _Loop(cfg, run_dir, engine, groups, tracer, rank, progress, plan)
        stopped = loop.run(Path(resume_from) if resume_from else None)
    finally:
        signal.signal(signal.SIGINT, previous)
    if distributed:
        del engine, groups, loop  # the groups must be gone before the backend they belong to
        _shut_down_together(cfg.parallel.comm_timeout_s)
    return stopped


def _shut_down_together(timeout_s: float) -> None:
    """Tear the process groups down once every rank is done with them: a rank that closes its
    connections while a peer still uses them can take the peer down."""
    timed_comm.barrier(timeout_s, "end of run", "the last barrier")
    gc.collect()
    dist.destroy_process_group()


class _Loop:
    def __init__(self, cfg: RunConfig, run_dir: Path, engine, groups, tracer, rank: int,
                 progress: bool, plan: PipelinePlan | None = None):
        self.cfg, self.run_dir, self.engine, self.plan = cfg, run_dir, engine, plan
        self.groups, self.tracer, self.rank = groups, tracer, rank
        self.is_main = rank == 0
        self.progress = progress and self.is_main
        dp, replica = (groups.grid.dp, groups.replica) if groups else (1, 0)
        self.loader, self.val = make_data(cfg, load_tokenizer(cfg.data.tokenizer), dp, replica)

    def _barrier(self, when: str, action: str) -> None:
        if self.groups:
            timed_comm.barrier(self.cfg.parallel.comm_timeout_s, when, action)

    def _gather(self, obj, when: str, action: str) -> list:
        if not self.groups:
            return [obj]
        return timed_comm.all_gather_object(obj, self.cfg.parallel.comm_timeout_s, when, action,
                                            self.groups.device)

    def _gather_counts(self, values: tuple, when: str, action: str) -> list[tuple]:
        """Every rank's `values` (whole numbers >= 0, or None), in rank order: one all-gather of
        a small int64 tensor on the groups' device, None travelling as -1."""
        if not self.groups:
            return [tuple(values)]
        mine = torch.tensor([-1 if v is None else int(v) for v in values], dtype=torch.int64,
                            device=self.groups.device)
        world = dist.get_world_size()
        out = [torch.empty_like(mine) for _ in range(world)]
        timed_comm.wait(dist.all_gather(out, mine, async_op=True), self.cfg.parallel.comm_timeout_s,
                        when, action, timed_comm.ranks_text(range(world), dist.get_rank()))
        return [tuple(None if v == -1 else v for v in row) for row in torch.stack(out).tolist()]

    def run(self, ckpt: Path | None) -> bool:
        """Train to the configured step, from `ckpt` if given; returns whether Ctrl-C stopped
        the run early (after a checkpoint)."""
        t = self.cfg.train
        if ckpt:
            self._resume(ckpt)
        start = self.loader.step
        log = MetricsLog(self.run_dir / "metrics.jsonl", start if ckpt else None) if self.is_main else None
        self.extras = StepExtras(self.cfg, self.run_dir, self.grid.world_size, self.engine.stage.device,
                                 start if ckpt else None) if self.is_main else None  # MFU, TensorBoard
        tokens_per_step = t.global_batch * t.seq_len
        bar = tqdm(total=t.steps, initial=start, disable=not self.progress, unit="step",
                   dynamic_ncols=True)
        self._barrier("start of training", "the first barrier")
        if self.tracer:
            self.tracer.reset_origin()
        rss = RssGrowth()
        rss.start()
        # what the RSS growth leaves out: the state allocated before training
        self.held_before_training = self.engine.ledger_bytes()
        rates, row = [], {}
        for step in range(start, t.steps):
            batches = next(self.loader)
            lr = lr_at(step, t)
            t0 = time.perf_counter()
            result = self.engine.train_step(batches, lr, step)
            elapsed = time.perf_counter() - t0
            if not math.isfinite(result.loss):
                newest = checkpoint.complete_dirs(self.run_dir)
                kept = f"the last good checkpoint is {newest[-1].name}" if newest else "no checkpoint was saved"
                raise TrainingDiverged(f"loss is {result.loss} at step {step + 1}; {kept}; "
                                       "lower the learning rate")
            peaks, ledger, growth, stops = zip(*self._gather_counts(
                (self.engine.peak_memory_bytes(), self.engine.ledger_peak_bytes(), rss.peak(),
                 stop_requested()), f"step {step + 1}", "the metrics gather"))
            row = {"step": step + 1, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
                   "tokens_per_s": tokens_per_step / elapsed, "step_time_s": elapsed,
                   "peak_memory_bytes": max(peaks)}
            if len(peaks) > 1:
                row["peak_memory_bytes_per_rank"] = list(peaks)
            if ledger[0] is not None:
                row["ledger_peak_bytes_per_rank"] = list(ledger)
            if growth[0] is not None and self.engine.stage.device.type == "cpu":
                row["rss_growth_bytes_per_rank"] = list(growth)
            if self.engine.loss_scale:
                row["loss_scale"] = self.engine.loss_scale.scale
                row["skipped"] = result.skipped
            # every replica joins the loss reduction, those with no validation share too
            if t.eval_batches > 0 and (step + 1 == t.steps or (t.eval_every and (step + 1) % t.eval_every == 0)):
                row["val_loss"] = self.engine.eval_loss(self.val)
            if step > start:  # the first step pays for warm-up allocations
                rates.append(row["tokens_per_s"])
            if log:
                self.extras.step(row)
                log.write(row)
            bar.update(1)
            bar.set_postfix(loss=f"{result.loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
            stop = any(stops) and step + 1 < t.steps  # every rank sees the same: all stop
            if stop or step + 1 == t.steps or (t.checkpoint_every and (step + 1) % t.checkpoint_every == 0):
                self._checkpoint(step + 1)
            if stop:
                bar.close()
                return True
        bar.close()
        self._finish(row, rates)
        return False

    def _resume(self, ckpt: Path) -> None:
        """Weights, optimizer states, loss scale, loader position and random generators."""
        meta = checkpoint.load_meta(ckpt)
        self.engine.load_unit_states(
            checkpoint.load_units(ckpt, self.engine.stage.units, self.engine.stage.device))
        if self.engine.loss_scale and "loss_scale" in meta:
            self.engine.loss_scale.load_state_dict(meta["loss_scale"])
        self.loader.load_state_dict(meta["loader"])
        # A rank of another layout has another job: it starts its generators afresh.
        if str(self.rank) in meta["rng"] and len(meta["rng"]) == self.grid.world_size:
            rng.restore(meta["rng"][str(self.rank)])

    def _checkpoint(self, step: int) -> None:
        files = {}
        states = self.engine.unit_states()
        if not self.groups or self.groups.replica == 0:
            files = checkpoint.save_units(self.run_dir, step, states)
        else:
            for _ in states:  # sharded state: join each unit's gather
                pass
        saved = self._gather((files, rng.capture()), f"step {step}", "the checkpoint's gather")
        if self.is_main:
            meta = {"config": self.cfg.to_dict(), "plan": self.plan.to_dict() if self.plan else None,
                    "loader": self.loader.state_dict(),
                    "rng": {str(r): generators for r, (_, generators) in enumerate(saved)}}
            if self.engine.loss_scale:  # every rank's scale is the same: same norms, same skips
                meta["loss_scale"] = self.engine.loss_scale.state_dict()
            written = {name: entry for files, _ in saved for name, entry in files.items()}
            checkpoint.finalize(self.run_dir, step, meta, written, self.cfg.train.keep_checkpoints)

    @property
    def grid(self) -> RankGrid:
        return self.groups.grid if self.groups else RankGrid(1, 1)

    def _per_stage(self, per_rank: list[int]) -> list[int]:
        """The largest of each stage's replicas."""
        grid = self.grid
        out = [0] * grid.pp
        for r, v in enumerate(per_rank):
            stage = grid.coords(r)[0]
            out[stage] = max(out[stage], v)
        return out

    def _finish(self, last: dict, rates: list[float]) -> None:
        traced = self._gather((self.tracer.events(), self.tracer.async_spans()) if self.tracer else None,
                              "end of run", "the trace gather")
        ledgers = self._gather((self.engine.ledger_at_peak(), self.held_before_training),
                               "end of run", "the memory gather")
        if not self.is_main:
            return
        if self.tracer:
            grid = self.grid
            labels = {r: "rank {} (stage {}, replica {})".format(r, *grid.coords(r)) for r in range(grid.world_size)}
            write_chrome_trace(self.run_dir / "trace.json", {r: t[0] for r, t in enumerate(traced)},
                               labels, {r: t[1] for r, t in enumerate(traced)})
        plot_loss(self.run_dir / "metrics.jsonl", self.run_dir / "loss.png", title=self.cfg.model.name)
        summary = {"run_dir": str(self.run_dir), "steps": last.get("step"), "final_loss": last.get("loss"),
                   "val_loss": last.get("val_loss"),
                   "tokens_per_s": sum(rates) / len(rates) if rates else last.get("tokens_per_s"),
                   "peak_memory_bytes": last.get("peak_memory_bytes"),
                   "schedule": self.cfg.parallel.schedule, "weight_grad": self.cfg.parallel.weight_grad,
                   "grad_lifetime": self.cfg.parallel.grad_lifetime}
        if "ledger_peak_bytes_per_rank" in last:
            summary["ledger_peak_bytes_per_stage"] = self._per_stage(last["ledger_peak_bytes_per_rank"])
            summary["ledger_at_peak_by_kind_per_rank"] = [at_peak for at_peak, _ in ledgers]
            summary["ledger_before_training_bytes_per_rank"] = [held for _, held in ledgers]
        if "rss_growth_bytes_per_rank" in last:
            summary["rss_growth_bytes_per_stage"] = self._per_stage(last["rss_growth_bytes_per_rank"])
        self.extras.finish(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
