"""The parallelism section of a run config (config.RunConfig's `parallel`): the layout of the
ranks, the schedule, where the state lives and how the replicas agree; its YAML keys are these
fields."""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.errors import UserError
from ratrain.field_errors import FieldError
from ratrain.schedule.activation_choice import ACTIVATIONS
from ratrain.schedule.outer_sync import EVERY_STEP, grad_sync_replicas, parse_sync
from ratrain.schedule.plan import SCHEDULES, STATE_HOMES
from ratrain.schedule.plan_rules import GRAD_LIFETIMES, HOST_GRAD_DTYPES, SPLIT_SCHEDULES, UPDATES
from ratrain.schedule.weight_grads import parse_placement

MAX_COMM_TIMEOUT_S = 7 * 24 * 3600

AUTO_SCHEDULE = "auto"  # the schedule and BW placement chosen by simulation (setup/choice.py)
AUTO_UPDATE = "auto"  # carried where the state's host is apart from the compute (setup/rule.py)


@dataclass
class ParallelConfig:
    pp: int = 1
    dp: int = 1
    policy: str = "ratrain"  # "ratrain" (per-unit sync and update) or "baseline" (GPU-style 1F1B)
    schedule: str = "auto"  # a name in schedule.plan.SCHEDULES, or auto: chosen by simulation (setup/choice.py)
    weight_grad: str | None = None  # a split schedule's BW placement: bubble (its default) or grouped
    micro_batch_group: int | None = None  # unit-major groups (schedule/unit_major.py); None: chosen with --schedule auto, else 1
    activation: str = "keep"  # decoder blocks' policy: keep, recompute or offload; or one per stage, comma-separated
    view_window: int = 0  # compute views made at most this many units ahead of use (0: all resident)
    state_home: str = "device"  # where masters, gradients and optimizer state live: device or host
    device_units: int = 0  # with state_home host: the first K units of each stage keep their state on the device
    host_grad_dtype: str = "float32"  # with state_home host: what the host-homed units' gradients accumulate in
    shard_state: bool = False  # each replica holds 1/dp of the masters and optimizer state (ZeRO-style)
    grad_lifetime: str = "step"  # sharded: how long the full-size gradient lives (schedule/plan_rules.GRAD_LIFETIMES)
    shard_group: int | None = None  # hybrid sharding: shard over groups of this many replicas, replicate across
    update: str = "auto"  # inline (U) or carried (SU/WU: schedule/carried_updates.py); auto: setup/rule.update_for
    partition: list[int] | None = None  # units per stage (embedding and head count as units)
    rank_order: str = "pp-dp"  # "pp-dp": a stage's replicas are neighbouring ranks; "dp-pp": a replica's stages are
    threads_per_rank: int | None = None  # each rank's CPU threads; None: training/prepare's rule
    backend: str = "auto"  # "auto": nccl with CUDA, gloo otherwise
    plan_file: str | None = None  # a PipelinePlan JSON to run instead of building one from the above
    comm_timeout_s: float = 300.0  # longest wait for a peer before the run ends naming it
    sync: str = EVERY_STEP  # how replicas agree: "step", or "diloco:H[:F][:bf16][:islands=K]" (schedule/outer_sync.py)

    @property
    def diloco(self) -> bool:
        """The replicas agree by outer steps (--sync diloco), each with state of its own."""
        return self.sync != EVERY_STEP

    @property
    def island_size(self) -> int:
        """Neighbouring replicas that hold the same state: those whose gradients are summed
        every step (all dp synchronously; --sync diloco: an island's, 1 without islands)."""
        return grad_sync_replicas(self.sync, self.dp)

    def files_of(self, replica: int) -> int:
        """Whose files of a checkpoint a replica's units are (checkpoint/store.py's replica):
        --sync diloco: its island's (its own, without islands); synchronously replica 0's (the
        first replica of a stage in each directory writes them). A resume of another layout
        reads others (training/resuming.py)."""
        if self.diloco:
            return replica // self.island_size
        return 0

    def validate(self) -> None:
        """Each value as such, refused naming its field (a FieldError: RunConfig.validate)."""
        if self.pp < 1 or self.dp < 1:
            raise FieldError(f"--pp and --dp must be >= 1, got pp={self.pp} dp={self.dp}",
                             "parallel.pp", "parallel.dp")
        if not 0 < self.comm_timeout_s <= MAX_COMM_TIMEOUT_S:  # also NaN; inf overflows timedelta
            raise FieldError(f"parallel.comm_timeout_s must be in (0, {MAX_COMM_TIMEOUT_S}] "
                             f"seconds, got {self.comm_timeout_s}", "parallel.comm_timeout_s")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise FieldError(f"--threads (parallel.threads_per_rank) must be >= 1, got "
                             f"{self.threads_per_rank}", "parallel.threads_per_rank")
        if self.policy not in ("ratrain", "baseline"):
            raise FieldError(f"unknown policy {self.policy!r}; available: ratrain, baseline",
                             "parallel.policy")
        if self.rank_order not in ("pp-dp", "dp-pp"):
            raise FieldError(f"unknown rank order {self.rank_order!r}; available: pp-dp, dp-pp",
                             "parallel.rank_order")
        if self.schedule not in SCHEDULES and self.schedule != AUTO_SCHEDULE:
            raise FieldError(f"unknown schedule {self.schedule!r}; available: "
                             f"{', '.join([AUTO_SCHEDULE, *SCHEDULES])}", "parallel.schedule")
        if self.weight_grad is not None:
            _parsed(parse_placement, self.weight_grad, "parallel.weight_grad")
            if self.schedule not in (*SPLIT_SCHEDULES, AUTO_SCHEDULE):
                raise FieldError(f"--weight-grad places the weight gradients of a split "
                                 f"backward; schedule {self.schedule!r} runs whole backwards "
                                 f"(use {', '.join(SPLIT_SCHEDULES)})", "parallel.weight_grad")
        policies = self.activation_per_stage
        if any(a not in ACTIVATIONS for a in policies):
            raise FieldError(f"activation policy must be one of {', '.join(ACTIVATIONS)} (or one "
                             f"per stage, comma-separated), got {self.activation!r}",
                             "parallel.activation")
        if len(policies) not in (1, self.pp):
            raise FieldError(f"--activation lists {len(policies)} policies for {self.pp} stages; "
                             "give one, or one per stage", "parallel.activation")
        if self.partition is not None and len(self.partition) != self.pp:
            raise FieldError(f"--partition {','.join(map(str, self.partition))} gives "
                             f"{len(self.partition)} stages' units for {self.pp} stages; give "
                             "one count per stage", "parallel.partition")
        if self.micro_batch_group is not None and self.micro_batch_group < 1:
            raise FieldError(f"--micro-batch-group must be >= 1, got {self.micro_batch_group}",
                             "parallel.micro_batch_group")
        if self.device_units < 0:
            raise FieldError(f"--device-units must be >= 0, got {self.device_units}",
                             "parallel.device_units")
        if self.view_window < 0:
            raise FieldError(f"--view-window must be >= 0, got {self.view_window}",
                             "parallel.view_window")
        if self.host_grad_dtype not in HOST_GRAD_DTYPES:
            raise FieldError(f"unknown host gradient dtype {self.host_grad_dtype!r}; available: "
                             f"{', '.join(HOST_GRAD_DTYPES)}", "parallel.host_grad_dtype")
        if self.grad_lifetime not in GRAD_LIFETIMES:
            raise FieldError(f"unknown gradient lifetime {self.grad_lifetime!r}; available: "
                             f"{', '.join(GRAD_LIFETIMES)}", "parallel.grad_lifetime")
        _parsed(parse_sync, self.sync, "parallel.sync")  # its refusal names the form
        if self.state_home not in STATE_HOMES:
            raise FieldError(f"state home must be one of {', '.join(STATE_HOMES)}, got "
                             f"{self.state_home!r}", "parallel.state_home")
        if self.update not in (AUTO_UPDATE, *UPDATES):
            raise FieldError(f"unknown update {self.update!r}; available: "
                             f"{', '.join([AUTO_UPDATE, *UPDATES])}", "parallel.update")

    @property
    def activation_per_stage(self) -> list[str]:
        """The activation policy as given: one for every stage, or one per stage."""
        return [a.strip() for a in str(self.activation).split(",")]


def _parsed(parse, text: str, key: str) -> None:
    """`parse(text)`'s refusal (a UserError naming the form), carrying `key`."""
    try:
        parse(text)
    except UserError as e:
        raise FieldError(str(e), key) from None
