"""Engines: what the training loop calls each step. Two of them, same interface.

`LocalEngine` is the plain single-process run: the whole model's autograd graph, gradient
accumulation, `clip_grad_norm_`, AdamW. It is also the reference every distributed run must match.
`PipelineEngine` runs this rank's program of a `PipelinePlan` through the executor (also in a
single process, with no process group, when the run asks for what only the executor does: views,
offload, float16, a plan file).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.runtime.process_memory import peak_memory_bytes
from ratrain.runtime.optim import set_lr
from ratrain.runtime import allocator
from ratrain.runtime.executor import Executor, StepResult
from ratrain.runtime.loss_scale import DynamicLossScale
from ratrain.runtime.stage import ShardOver, Stage
from ratrain.schedule.ir import Action, Op
from ratrain.schedule.outer_sync import parse_sync, step_programs
from ratrain.schedule.eval_programs import build_eval_programs
from ratrain.schedule.plan import PipelinePlan
from ratrain.runtime.outer_sync import OuterStates
from ratrain.runtime.tied_copy import shared_head, split_head


class _UnitStateMixin:
    stage: Stage

    loss_scale: DynamicLossScale | None = None
    outer: OuterStates | None = None  # --sync diloco's outer state

    def unit_states(self):
        """(unit, its whole weights and optimizer state) for each unit of the stage, made one
        at a time as the caller iterates: with sharded state each is a gather that every
        replica of the stage must join, in the same order. A head with its own copy of a tied
        embedding leaves the copy out (runtime/tied_copy.py)."""
        outer = self.outer.units if self.outer else {}
        for u in self.stage.modules:
            state = {"weights": self.stage.weights(u),
                     "optim": self.stage.state[u].optimizer_state(),
                     **({"outer": outer[u].state_dict()} if u in outer else {})}
            unit = self.stage.state[u]
            if unit.tied_copy:
                state = shared_head(state, unit)
            yield u, state

    def checkpoint_units(self) -> list[int]:
        """The units whose files resuming reads: the stage's, and the embedding's where the
        stage's head makes its copy of a tied embedding from them."""
        copies = any(s.tied_copy for s in self.stage.state.values())
        return [*([0] if copies else []), *self.stage.units]

    def load_unit_states(self, states: Mapping[int, dict]) -> None:
        for u in self.stage.units:
            state, unit = states[u], self.stage.state[u]
            if unit.tied_copy:
                state = split_head(state, states[0], unit)
            self.stage.load_weights(u, state["weights"])
            if state["optim"] is not None:
                unit.load_optimizer_state(state["optim"])
            if self.outer and u in self.outer.units:  # a synchronous run's has none: start afresh
                self.outer.units[u].load_state_dict(state.get("outer") or self.outer.units[u].fresh())

    def finish_updates(self) -> None:
        """Every optimizer update started has completed: none runs beyond its step here."""

    def peak_memory_bytes(self) -> int:
        return peak_memory_bytes(self.stage.device)

    def ledger_peak_bytes(self) -> int | None:
        return None  # the plain engine keeps no ledger

    def ledger_at_peak(self) -> dict[str, int] | None:
        return None

    def ledger_bytes(self) -> int | None:
        return None


def needs_executor(cfg: RunConfig) -> bool:
    """Whether a single-process run needs the executor rather than LocalEngine (which runs
    1F1B's order, keeping everything, in fp32, each update inline). (Until 2026-12-02 a
    --micro-batch-group or --update carried of a plain run was dropped without a word.)"""
    p = cfg.parallel
    return bool(p.plan_file or p.activation_per_stage != ["keep"] or cfg.train.dtype != "float32"
                or p.state_home != "device" or p.schedule not in ("1f1b", AUTO_SCHEDULE)
                or p.weight_grad is not None or (p.micro_batch_group or 1) > 1
                or p.update == "carried")


class LocalEngine(_UnitStateMixin):
    def __init__(self, cfg: RunConfig, device: torch.device, modules=None):
        self.cfg = cfg
        self.stage = Stage(cfg, range(cfg.model.n_units), device, modules)

    def _loss(self, x, y) -> torch.Tensor:
        h = x.to(self.stage.device)
        *units, head = self.stage.units
        with self.stage.autocast():
            for u in units:
                h = self.stage.modules[u](h)
            return self.stage.modules[head].loss(h, y.to(self.stage.device))

    def train_step(self, batches, lr: float, step: int = 0) -> StepResult:
        self.stage.train(True)
        set_lr(self.stage.optimizers(), lr)
        total = 0.0
        for x, y in batches:
            loss = self._loss(x, y)
            (loss / len(batches)).backward()
            total += float(loss.detach())
        params = self.stage.master_params()
        clip = self.cfg.train.grad_clip
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf")))
        for state in self.stage.state.values():
            state.update()
        return StepResult(total / len(batches), norm)

    @torch.no_grad()
    def eval_loss(self, batches) -> float:
        self.stage.train(False)
        return sum(float(self._loss(x, y)) for x, y in batches) / len(batches)


class PipelineEngine(_UnitStateMixin):
    """This rank's stage of `plan`; `groups` None for a single process (pp = dp = 1), which
    then computes on `device`."""

    def __init__(self, cfg: RunConfig, plan: PipelinePlan, groups, tracer=None, modules=None,
                 device: torch.device | None = None):
        self.cfg = cfg
        self.plan = plan
        self.groups = groups
        self.stage_index = groups.stage if groups else 0
        self.program = plan.programs[self.stage_index]
        view_units = {a.unit for a in self.program if a.op is Op.PREFETCH}
        shard = (ShardOver(groups.shard, groups.shard_replica, groups.shard_replicas,
                           plan.grad_lifetime, groups.cross_group)
                 if plan.shard_state else None)
        self.stage = Stage(cfg, plan.stage_units[self.stage_index],
                           groups.device if groups else device,
                           modules, view_units=view_units, state_home=plan.state_home, shard=shard,
                           device_units=plan.device_units, summed_on_device=plan.summed_on_device,
                           host_grad_dtype=plan.host_grad_dtype)
        if plan.weight_grad is not None and self.stage.device.type == "cpu":
            allocator.keep_freed_memory()
        act_shape = (cfg.train.micro_batch_size, cfg.train.seq_len, cfg.model.dim)
        # Views compute in the compute dtype end to end; masters under autocast keep fp32
        # activations between units.
        act_dtype = self.stage.dtype if view_units else torch.float32
        self.loss_scale = DynamicLossScale() if cfg.train.dtype == "float16" else None
        if self.loss_scale and not any(a.op is Op.GRAD_NORM for a in self.program):
            raise ValueError("float16 needs the global gradient norm (N, WN) in the program to "
                             "detect overflow; build the plan with clip=True")
        sync = parse_sync(plan.sync)
        self.outer = OuterStates(self.stage.state, sync, cfg.train) if sync else None
        self.executor = Executor(self.stage, act_shape, groups=groups, clip=cfg.train.grad_clip,
                                 tracer=tracer, act_dtype=act_dtype, loss_scale=self.loss_scale,
                                 comm_timeout_s=cfg.parallel.comm_timeout_s, outer=self.outer)
        self._eval_programs: dict[int, list] = {}

    def ledger_peak_bytes(self) -> int:
        """The peak of the bytes the executor and the units' training state held."""
        return self.stage.ledger.peak

    def ledger_at_peak(self) -> dict[str, int]:
        """Those bytes by kind, at the peak."""
        return dict(self.stage.ledger.at_peak)

    def ledger_bytes(self) -> int:
        """The bytes held now."""
        return self.stage.ledger.total

    def train_step(self, batches, lr: float, step: int = 0) -> StepResult:
        # with an outer sync the step decides which units sync in it (schedule/outer_sync.py),
        # the run's last step all that have steps the outer parameters do not hold
        program = (step_programs(self.plan, step, self.cfg.train.steps)[self.stage_index]
                   if self.outer else self.program)
        return self.executor.train_step(program, batches, lr, step)

    def finish_updates(self) -> None:
        """The carried updates still running on the host thread (the last step's: the next
        step would have waited for them) have completed, and any error in them is raised."""
        self.executor.host_updates.finish()

    def unit_states(self):
        self.finish_updates()  # a carried update still running: the masters
        return super().unit_states()

    def eval_loss(self, batches) -> float:
        """The mean loss over `batches` (this replica's share; E reduces over the replicas);
        --sync diloco: of the outer parameters, not this replica's local ones."""
        if self.outer is None:
            return self._eval_loss(batches)
        with self.outer.outer_weights():
            return self._eval_loss(batches)

    def _eval_loss(self, batches) -> float:
        n = len(batches)
        # Sharded views are gathers every replica joins, but replicas may get different numbers
        # of validation micro-batches: the views are gathered around the program instead.
        window = None if self.plan.shard_state else self.plan.view_window
        if n not in self._eval_programs:
            # A replica with no validation share still joins the loss reduction at step end.
            self._eval_programs[n] = (
                build_eval_programs(self.plan.stage_units, n, window,
                                    self.plan.shared_views)[self.stage_index]
                if n else [Action(Op.STEP_END)])
        if not self.plan.shard_state:
            return self.executor.eval_step(self._eval_programs[n], batches)
        states = self.stage.state.values()
        for state in states:
            state.prefetch()
        for state in states:
            state.wait_view()
        loss = self.executor.eval_step(self._eval_programs[n], batches)
        if self.plan.view_window:  # not resident: released as the training program would
            for state in states:
                state.release_view()
        return loss
