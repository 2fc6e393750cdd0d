"""One rank's training loop: data -> engine -> steps -> metrics, validation, checkpoints,
trace and summary."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ratrain import checkpoint
from ratrain.checkpoint import rng, saving
from ratrain.config import RunConfig
from ratrain.data.replica import Stream, make_data
from ratrain.data.tokenizer import load_tokenizer
from ratrain.errors import Interrupted
from ratrain.runtime import timed_comm
from ratrain.runtime.launch import stop_signal, stopped_how
from ratrain.runtime.optim import lr_at
from ratrain.runtime.process_memory import RssGrowth
from ratrain.runtime.trace import write_chrome_trace
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.plan import PipelinePlan
from ratrain.training.diverged import diverged as diverged_at
from ratrain.training.metrics import MetricsLog, StepExtras, write_failed
from ratrain.training.resuming import OuterAsWeights, resumed_state, say_what_changed
from ratrain.training.run_dir import checkpoints_of
from ratrain.training.run_summary import write_summary
from ratrain.training.shared_dir import DirectoryShare
from ratrain.training.step_meetings import StepFigures, StepMeetings, agreed_stop, meeting_steps
from ratrain.training.step_rows import StepRows
from ratrain.training.whole_run import RunPeaks, Throughput


class Loop:
    """One rank's steps of a run, on its engine and (with several ranks) its process groups."""

    def __init__(self, cfg: RunConfig, run_dir: Path, engine, groups, tracer, rank: int,
                 progress: bool, plan: PipelinePlan | None = None,
                 share: DirectoryShare | None = None, stream: Stream | None = None):
        """`share`: the ranks that see this rank's checkpoint directory (None: every rank);
        `stream`: the token stream the run's start checked (data.check_data), which every rank
        reads (None: its own read of cfg's data)."""
        self.cfg, self.run_dir, self.engine, self.plan = cfg, run_dir, engine, plan
        self.groups, self.tracer, self.rank = groups, tracer, rank
        self.is_main = rank == 0
        self.share = share or DirectoryShare(tuple(range(self.grid.world_size)))
        self.publishes = rank == self.share.publisher  # this directory's checkpoints
        self.progress = progress and self.is_main
        dp, self.replica = (groups.grid.dp, groups.replica) if groups else (1, 0)
        self.loader, self.val = make_data(cfg, load_tokenizer(cfg.data.tokenizer), dp,
                                          self.replica, stream=stream)
        self.where = checkpoints_of(run_dir, cfg)
        self.saver = saving.Saver(background=cfg.train.checkpoint_async)
        self._said_stop = self._said_short = False  # (each said once a run)
        self._taking: int | None = None  # the step whose state is being taken for its save
        self.bar: tqdm | None = None

    def _barrier(self, when: str, action: str) -> None:
        if self.groups:
            timed_comm.barrier(self.cfg.parallel.comm_timeout_s, when, action)

    def _gather(self, obj, when: str, action: str) -> list:
        if not self.groups:
            return [obj]
        return timed_comm.all_gather_object(obj, self.cfg.parallel.comm_timeout_s, when, action,
                                            self.groups.device)

    def run(self, ckpt: Path | None, verified: bool = True) -> int | None:
        """Train to the configured step, from `ckpt` if given (`verified`: its files hashed
        already, else this rank hashes those it reads); returns the signal that stopped the run
        early (after a checkpoint), the same on every rank (step_meetings.agreed_stop), or None."""
        try:
            return self._run(ckpt, verified)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (launch._Terminated): no failure
            self._stop_saving(getattr(e, "signum", signal.SIGINT))
            raise
        except BaseException:
            self.saver.abandon()  # a save in flight stops between units, unpublished
            raise
        finally:  # before the caller says how the run ended: tqdm redraws an open bar below it
            if self.bar is not None:
                self.bar.close()

    def _run(self, ckpt: Path | None, verified: bool) -> int | None:
        t = self.cfg.train
        meta = self._resume(ckpt, verified) if ckpt else None
        start = self.loader.step
        log = (MetricsLog(self.run_dir / "metrics.jsonl", start if ckpt else None, self.where)
               if self.is_main else None)
        self.extras = StepExtras(self.cfg, self.run_dir, self.grid.world_size, self.engine.stage.device,
                                 start if ckpt else None, meta and meta.get("cpu_core_peak")
                                 ) if self.is_main else None  # MFU, TensorBoard
        # the run's earlier parts, as the main rank wrote them (the others write no rows)
        kept = log.kept if log else []
        self.peaks = RunPeaks(kept, meta is None or self._same_layout(meta), start)
        step_rows = StepRows(self.engine, self.grid, self.peaks)
        throughput = Throughput(kept)
        tokens_per_step = t.global_batch * t.seq_len
        bar = self.bar = tqdm(total=t.steps, initial=start, disable=not self.progress, unit="step",
                              dynamic_ncols=True)
        if self.publishes:  # what a save cut short left (a kill): a save of this run may reuse its name
            checkpoint.remove_partials(self.where)
        self._barrier("start of training", "the first barrier")
        if self.tracer:
            self.tracer.reset_origin()
        rss = RssGrowth()
        rss.start()
        # what the RSS growth leaves out: the state allocated before training
        self.held_before_training = self.engine.ledger_bytes()
        row = {}
        meetings = StepMeetings(self.groups, self.cfg.parallel.comm_timeout_s,
                                meeting_steps(t, self.engine.outer.sync if self.engine.outer else None))
        mine: dict[int, dict] = {}  # this rank's rows of the steps the replicas have not met on
        for step in range(start, t.steps):
            batches = next(self.loader)
            lr = lr_at(step, t)
            t0 = time.perf_counter()
            result = self.engine.train_step(batches, lr, step)
            elapsed = time.perf_counter() - t0
            mine[step] = {"step": step + 1, "loss": result.loss, "lr": lr,
                          "grad_norm": result.grad_norm, "tokens_per_s": tokens_per_step / elapsed,
                          "step_time_s": elapsed}
            scale = self.engine.loss_scale
            if scale:
                mine[step].update(loss_scale=scale.scale, skipped=result.skipped)
            if step > start:  # the first step pays for warm-up allocations
                throughput.add(step + 1, tokens_per_step, elapsed)
            elif ckpt:  # so does a resumed part's: whole-run means leave this row out
                mine[step]["resumed"] = True
                if self.peaks.from_step == step + 1:
                    mine[step]["memory_peaks_from_step"] = step + 1
            met = meetings.add(step, StepFigures(
                result.loss, self.engine.peak_memory_bytes(), self.engine.ledger_peak_bytes(),
                rss.peak(), stop_signal(), scale.scale if scale else None,
                result.skipped if scale else None))
            self.saver.check()  # a save that failed ends the run now
            if not met:
                bar.update(1)
                self._say_stop_waits(step, meetings)
                continue
            rows = [step_rows.row(mine.pop(s), figures, s + 1 == t.steps) for s, figures in met]
            bad = next((i for i, r in enumerate(rows) if not math.isfinite(r["loss"])), None)
            diverged = rows[bad] if bad is not None else None
            if diverged:  # the rows before it are written: they were good steps
                rows = rows[:bad]
            elif t.evaluates_after(step + 1):
                # every replica joins the loss reduction, those with no validation share too
                rows[-1]["val_loss"] = self.engine.eval_loss(self.val)
            if log:
                for r in rows:
                    self.extras.step(r)
                    log.write(r)
            if diverged:
                diverged_at(diverged, self.cfg, self.saver, self.where, self.publishes)
            row = rows[-1]
            # refresh=False: drawn at tqdm's own pace, not every step (500k steps made 42 MB
            # of one log line); --sync diloco: the loss of the step the replicas last met at
            said = "loss" if self.engine.outer is None else f"loss@{row['step']}"
            bar.set_postfix({said: f"{row['loss']:.3f}", "tok_s": f"{row['tokens_per_s']:.0f}"},
                            refresh=False)
            bar.update(1)  # after the postfix: a redraw here shows this step's loss, not the last's
            # every rank sees the same: all stop
            stop = agreed_stop(met) if step + 1 < t.steps else None
            if stop or t.saves_after(step + 1):
                self._checkpoint(step + 1)
            if stop:
                meetings.finish()
                bar.close()
                self.saver.wait()
                return stop
        meetings.finish()
        bar.close()
        self.engine.finish_updates()  # the last step's carried updates: waited by no next step
        self.saver.wait()  # the end of the run: its checkpoint published before the summary
        self._finish(row, throughput)
        return None

    def _stop_saving(self, signum: int) -> None:
        """A stop request raised in this thread: the save in flight is let finish (Saver.stop),
        said by rank 0 where it takes a while; with --checkpoint-on-interrupt the loop took the
        first request, so this is the second, which drops it at once. A save dropped, or cut
        short as this thread took its state, is said as the run stops."""
        cut, self._taking = self._taking, None
        flying = self.saver.times[-1]["step"] if self.saver.in_flight() else None
        dropped = self.saver.stop(lambda step: self.is_main and tqdm.write(
            f"waiting for the save of step_{step:06d} to finish (Ctrl-C again to drop it)",
            file=sys.stderr), let_finish=not self.cfg.train.checkpoint_on_interrupt)
        if dropped is None and cut != flying:  # (the save let finish may be the one it took)
            dropped = cut
        if dropped is not None:
            raise Interrupted(f"{stopped_how(signum)}; the save of step_{dropped:06d} in flight "
                              "was dropped", signum=signum) from None

    def _say_stop_waits(self, step: int, meetings: StepMeetings) -> None:
        """Ctrl-C between the replicas' meetings: say when they will stop (once). Said by the
        first rank of each node asked: the replicas send nothing between meetings, so rank 0
        learns of a request made on another node (torchrun) only at the meeting, as it stops."""
        if not stop_signal() or self._said_stop or int(os.environ.get("LOCAL_RANK", 0)):
            return
        self._said_stop = True
        meeting = next(s for s in range(step + 1, self.cfg.train.steps) if meetings.meets(s))
        tqdm.write(f"stopping after step {meeting + 1}, where the replicas next meet (--sync "
                   "diloco: they do not talk between outer syncs); Ctrl-C again stops them at "
                   "once", file=sys.stderr)

    def _same_layout(self, meta: dict) -> bool:
        """Whether the checkpoint's ranks had this run's ranks' jobs (pp, dp and rank order)."""
        return all(meta["config"]["parallel"].get(k) == getattr(self.cfg.parallel, k)
                   for k in ("pp", "dp", "rank_order"))

    def _resume(self, ckpt: Path, verified: bool) -> dict:
        """Weights, optimizer states, loss scale, loader position and random generators; returns
        the checkpoint's manifest."""
        meta = checkpoint.load_meta(ckpt)
        whose = resumed_state(meta["config"]["parallel"], self.cfg.parallel, self.replica)
        # read to the host a unit at a time: loading copies each into the unit's own home
        states = checkpoint.load_units(ckpt, self.engine.checkpoint_units(), "cpu", whose.files,
                                       verified=verified)
        self.engine.load_unit_states(OuterAsWeights(states, self.cfg) if whose.from_outer
                                     else states)
        # A rank of another layout (pp, dp or rank order) has another job: it takes the run's
        # loss scale, not the rank's own (DiLoCo's), and starts its generators afresh.
        same_layout = self._same_layout(meta)
        scale = (meta.get("loss_scale_per_rank", {}).get(str(self.rank)) if same_layout
                 else None) or meta.get("loss_scale")
        if self.engine.loss_scale and scale:
            self.engine.loss_scale.load_state_dict(scale)
        self.loader.load_state_dict(meta["loader"])
        if self.is_main:
            say_what_changed(meta, self.cfg, self.loader.state_dict())
        if same_layout and str(self.rank) in meta["rng"]:
            rng.restore(meta["rng"][str(self.rank)])
        return meta

    def _checkpoint(self, step: int) -> None:
        """Save the state after `step`: taken now, in this thread (copied to host memory, see
        checkpoint/saving.py), written and (main rank) published by the saver, in the
        background unless --checkpoint-sync. The previous save is waited for first."""
        self.saver.wait()
        self._taking = step  # until the writer has it (or, --checkpoint-sync, has written it)
        t0 = time.perf_counter()
        # --sync diloco: each island's (replica's) local state is its own, and its first replica
        # in the directory saves it; else the directory's first replica of the stage saves the
        # units all hold (sharded: the others join the gathers)
        writes = self.share.first_of_stage(self.grid, self.rank, self.cfg.parallel.island_size)
        taken = saving.take(self.where, step, self.engine.unit_states(), writes,
                            copy=self.saver.background,
                            replica=self.cfg.parallel.files_of(self.replica),
                            outer=self.share.first_of_stage(self.grid, self.rank))
        generators = rng.capture()
        meta = None
        if self.publishes:
            meta = {"config": self.cfg.to_dict(), "plan": self.plan.to_dict() if self.plan else None,
                    "loader": dict(self.loader.state_dict())}
            if self.share.node_local:  # this directory holds these ranks' part only
                meta["ranks"] = list(self.share.ranks)
            if self.engine.loss_scale:  # every rank's scale is the same: same norms, same skips
                meta["loss_scale"] = self.engine.loss_scale.state_dict()
            if self.extras and self.extras.peak.measured:  # for a resume's MFU (mfu.run_peak)
                meta["cpu_core_peak"] = self.extras.peak.measured
        # --sync diloco: each replica's norm, skips and scale are its own
        own_scale = (self.engine.loss_scale.state_dict()
                     if self.engine.loss_scale and self.engine.outer is not None else None)
        if taken.written_now and self.saver.background and not self._said_short:
            self._said_short = True
            print(f"rank {self.rank}: host memory is short of a snapshot: {taken.written_now} "
                  f"unit(s) of checkpoint step_{step:06d} written before training went on",
                  file=sys.stderr, flush=True)
        keep, timeout_s, cancelled = (self.cfg.train.keep_checkpoints,
                                      self.cfg.parallel.comm_timeout_s, self.saver.cancelled)

        def job() -> None:
            saving.write_part(self.where, step, self.rank, taken, generators, cancelled,
                              own_scale)
            if meta is not None:
                saving.publish(self.where, step, self.share.ranks, meta, keep, timeout_s,
                               cancelled)

        self.saver.submit(step, time.perf_counter() - t0, job)
        self._taking = None

    @property
    def grid(self) -> RankGrid:
        return self.groups.grid if self.groups else RankGrid(1, 1)

    def _finish(self, last: dict, throughput: Throughput) -> None:
        traced = self._gather((self.tracer.events(), self.tracer.async_spans()) if self.tracer else None,
                              "end of run", "the trace gather")
        ledgers = self._gather((self.engine.ledger_at_peak(), self.held_before_training),
                               "end of run", "the memory gather")
        if not self.is_main:
            return
        if self.tracer:
            grid = self.grid
            labels = {r: "rank {} (stage {}, replica {})".format(r, *grid.coords(r)) for r in range(grid.world_size)}
            path = self.run_dir / "trace.json"
            try:
                write_chrome_trace(path, {r: t[0] for r, t in enumerate(traced)}, labels,
                                   {r: t[1] for r, t in enumerate(traced)})
            except OSError as e:
                path.unlink(missing_ok=True)  # half a trace would not load
                raise write_failed(path, e, self.where) from None
        write_summary(self.run_dir, self.cfg, self.grid, last, throughput, self.peaks, ledgers,
                      self.saver.times, self.extras, self.where)
