"""Configuration dataclasses: model, data, training, parallelism; YAML/JSON in and out.

The global batch belongs to TrainConfig and never changes with pp/dp: parallelism only changes
who computes it, never the math.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ratrain.errors import UserError
from ratrain.model_config import ModelConfig, check_finite
from ratrain.plain_data import parse_error, shown, typed_dataclass, unknown_keys
from ratrain.schedule.plan_rules import GRAD_LIFETIMES, HOST_GRAD_DTYPES, SPLIT_SCHEDULES, UPDATES
from ratrain.schedule.plan import ACTIVATIONS, SCHEDULES, STATE_HOMES
from ratrain.schedule.weight_grads import parse_placement
from ratrain.schedule.outer_sync import EVERY_STEP, grad_sync_replicas, parse_sync

DTYPES = ("float32", "bfloat16", "float16")
MAX_COMM_TIMEOUT_S = 7 * 24 * 3600

AUTO_SCHEDULE = "auto"  # the schedule and BW placement chosen by simulation (setup/choice.py)
AUTO_UPDATE = "auto"  # carried where the state's host is apart from the compute (setup/rule.py)


@dataclass
class DataConfig:
    path: str | None = None  # None: the running Python's standard library (*.py)
    tokenizer: str = "byte"  # "byte", or a tokenizer.json file / a directory holding one
    val_fraction: float = 0.05
    cache_dir: str | None = None  # None: ~/.cache/ratrain (or $RATRAIN_CACHE)

    def validate(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise UserError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}")


@dataclass
class TrainConfig:
    seq_len: int = 256
    global_batch: int = 8  # sequences per optimizer step, whatever pp and dp are
    micro_batch_size: int = 2
    steps: int = 300
    lr: float = 3e-3
    min_lr: float | None = None  # where the cosine ends; None: lr / 10 (an lr below a fixed floor rose to it)
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    eval_every: int = 100
    eval_batches: int = 4  # the validation set: this many global batches of the split's first sequences
    seed: int = 0
    dtype: str = "float32"  # compute dtype: float32, bfloat16 or float16 (masters stay fp32; float16 with loss scaling)
    checkpoint_every: int = 100  # steps between checkpoints (0: only at the end of the run)
    checkpoints: bool = True  # False: no checkpoint at all, not even at the end (Ctrl-C's is its own switch)
    checkpoint_dir: str | None = None  # where checkpoints go (step_N/ directly in it); None: RUN/checkpoints
    checkpoint_async: bool = True  # write checkpoints on a background thread while training goes on
    keep_checkpoints: int = 2  # the newest this many complete checkpoints are kept
    checkpoint_on_interrupt: bool = False  # Ctrl-C: finish the step, save a checkpoint, then stop
    init_from: str | None = None  # Hugging Face model directory whose weights start the run
    tensorboard: bool = False  # also write each step's metrics as TensorBoard scalars (RUN_DIR/tensorboard/)
    profile: str | None = None  # hardware profile (preset or YAML): the device peak for MFU, the report's simulated step
    # --sync diloco (schedule/outer_sync.py): the outer Nesterov SGD's rate and momentum
    # (DiLoCo's defaults), and Streaming DiLoCo's share of the local parameters kept when a
    # fragment's outer result arrives a step late
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_mix: float = 0.5

    @property
    def final_lr(self) -> float:
        """The cosine's floor: min_lr, or a tenth of the peak."""
        return self.lr / 10 if self.min_lr is None else self.min_lr

    def evaluates_after(self, n: int) -> bool:
        """Whether validation runs after step `n` (1-based)."""
        return self.eval_batches > 0 and (n == self.steps or bool(self.eval_every
                                                                   and n % self.eval_every == 0))

    def saves_after(self, n: int) -> bool:
        """Whether a checkpoint is saved after step `n` (1-based) on schedule."""
        return self.checkpoints and (n == self.steps or bool(self.checkpoint_every
                                                             and n % self.checkpoint_every == 0))

    def validate(self) -> None:
        # a NaN passes every comparison below, an inf most: each is refused by name first
        for name in ("lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "adam_eps",
                     "grad_clip", "outer_lr", "outer_momentum", "outer_mix"):
            check_finite(f"train.{name}", getattr(self, name))
        for name in ("seq_len", "global_batch", "micro_batch_size", "steps", "lr", "adam_eps",
                     "keep_checkpoints", "outer_lr"):
            if getattr(self, name) <= 0:
                raise UserError(f"train.{name} must be positive, got {getattr(self, name)}")
        for name in ("warmup_steps", "weight_decay", "grad_clip", "eval_every",
                     "eval_batches", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise UserError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise UserError(f"train.min_lr must be in [0, lr = {self.lr}], got {self.min_lr}")
        for name in ("beta1", "beta2", "outer_momentum", "outer_mix"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.global_batch % self.micro_batch_size:
            hint = (" (the default: set --micro-batch-size)"
                    if self.micro_batch_size == type(self).micro_batch_size else "")
            raise UserError(f"train.global_batch {self.global_batch} is not a multiple of "
                            f"micro_batch_size {self.micro_batch_size}{hint}")
        if self.dtype not in DTYPES:
            raise UserError(f"train.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.checkpoint_dir is not None and not self.checkpoint_dir.strip():
            raise UserError("train.checkpoint_dir must name a directory, got an empty string")


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
        if self.pp < 1 or self.dp < 1:
            raise UserError(f"--pp and --dp must be >= 1, got pp={self.pp} dp={self.dp}")
        if not 0 < self.comm_timeout_s <= MAX_COMM_TIMEOUT_S:  # also NaN; inf overflows timedelta
            raise UserError(f"parallel.comm_timeout_s must be in (0, {MAX_COMM_TIMEOUT_S}] seconds, "
                            f"got {self.comm_timeout_s}")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise UserError(f"--threads (parallel.threads_per_rank) must be >= 1, got "
                            f"{self.threads_per_rank}")
        if self.policy not in ("ratrain", "baseline"):
            raise UserError(f"unknown policy {self.policy!r}; available: ratrain, baseline")
        if self.rank_order not in ("pp-dp", "dp-pp"):
            raise UserError(f"unknown rank order {self.rank_order!r}; available: pp-dp, dp-pp")
        if self.schedule not in SCHEDULES and self.schedule != AUTO_SCHEDULE:
            raise UserError(f"unknown schedule {self.schedule!r}; available: "
                            f"{', '.join([AUTO_SCHEDULE, *SCHEDULES])}")
        if self.weight_grad is not None:
            parse_placement(self.weight_grad)
            if self.schedule not in (*SPLIT_SCHEDULES, AUTO_SCHEDULE):
                raise UserError(f"--weight-grad places the weight gradients of a split backward; "
                                f"schedule {self.schedule!r} runs whole backwards (use "
                                f"{', '.join(SPLIT_SCHEDULES)})")
        policies = self.activation_per_stage
        if any(a not in ACTIVATIONS for a in policies):
            raise UserError(f"activation policy must be one of {', '.join(ACTIVATIONS)} (or one per "
                            f"stage, comma-separated), got {self.activation!r}")
        if len(policies) not in (1, self.pp):
            raise UserError(f"--activation lists {len(policies)} policies for {self.pp} stages; "
                            "give one, or one per stage")
        if self.partition is not None and len(self.partition) != self.pp:
            raise UserError(f"--partition {','.join(map(str, self.partition))} gives "
                            f"{len(self.partition)} stages' units for {self.pp} stages; give one "
                            "count per stage")
        if self.micro_batch_group is not None and self.micro_batch_group < 1:
            raise UserError(f"--micro-batch-group must be >= 1, got {self.micro_batch_group}")
        if self.device_units < 0:
            raise UserError(f"--device-units must be >= 0, got {self.device_units}")
        if self.view_window < 0:
            raise UserError(f"--view-window must be >= 0, got {self.view_window}")
        if self.host_grad_dtype not in HOST_GRAD_DTYPES:
            raise UserError(f"unknown host gradient dtype {self.host_grad_dtype!r}; available: "
                            f"{', '.join(HOST_GRAD_DTYPES)}")
        if self.grad_lifetime not in GRAD_LIFETIMES:
            raise UserError(f"unknown gradient lifetime {self.grad_lifetime!r}; available: "
                            f"{', '.join(GRAD_LIFETIMES)}")
        parse_sync(self.sync)  # a UserError naming the form
        if self.state_home not in STATE_HOMES:
            raise UserError(f"state home must be one of {', '.join(STATE_HOMES)}, got {self.state_home!r}")
        if self.update not in (AUTO_UPDATE, *UPDATES):
            raise UserError(f"unknown update {self.update!r}; available: "
                            f"{', '.join([AUTO_UPDATE, *UPDATES])}")

    @property
    def activation_per_stage(self) -> list[str]:
        """The activation policy as given: one for every stage, or one per stage."""
        return [a.strip() for a in str(self.activation).split(",")]


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def validate(self) -> None:
        """The values as such: ranges, names, finite numbers, the sequence within the model's.
        Whether their combination can run (layout, batch split, state home, dtype, hardware) is
        the rule of setup/rule.py, which the setup stage (setup.run_plan, that calls this
        first) and the planner apply. A refusal of a value a flag gave names the flag."""
        try:
            self.model.validate()
            self.data.validate()
            self.train.validate()
            self.parallel.validate()
            if self.train.seq_len > self.model.max_seq_len:
                raise UserError(f"seq_len {self.train.seq_len} exceeds the model's max_seq_len "
                                f"{self.model.max_seq_len}")
        except UserError as e:
            raise _led_by_flags(e, vars(self).get("_flags", {})) from None

    def take_flag(self, flag: str, section: str, name: str, value: Any) -> None:
        """`section`.`name` = `value`, typed as `flag`: a refusal of it names the flag (from
        cli/options.py). Not a field: config.yaml keeps values, not where they came from."""
        setattr(getattr(self, section), name, value)
        vars(self).setdefault("_flags", {})[f"{section}.{name}"] = flag

    @property
    def n_micro(self) -> int:
        """Micro-batches per data-parallel replica per optimizer step."""
        return self.train.global_batch // (self.parallel.dp * self.train.micro_batch_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> RunConfig:
        """A config from plain data (a parsed YAML/JSON file): every key known, every value of
        its field's type, or a UserError naming the path (`train.lr: expected a number, got
        'fast'`)."""
        if not isinstance(d, dict):
            raise UserError(f"a run config must be a mapping of sections, got {shown(d)}")
        sections = {f.name: f for f in dataclasses.fields(cls)}
        unknown = unknown_keys(d, sections)
        if unknown:
            raise UserError(f"unknown config section(s): {', '.join(unknown)} "
                            f"(known: {', '.join(sections)})")
        parts = {}
        for name, f in sections.items():
            sub = d.get(name) or {}
            if not isinstance(sub, dict):
                raise UserError(f"{name}: expected a mapping, got {shown(sub)}")
            parts[name] = _build(f.default_factory, sub, name)  # type: ignore[misc]
        return cls(**parts)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        d = self.to_dict()
        write_whole(path, json.dumps(d, indent=2) if path.suffix == ".json"
                    else yaml.safe_dump(d, sort_keys=False))

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            d = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
        except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
            raise UserError(f"cannot parse config {path}: {parse_error(e)}") from None
        return cls.from_dict(d or {})


def _led_by_flags(error: UserError, flags: dict[str, str]) -> UserError:
    """`error` led by the flags (by key) that gave values it names, by key or, where it is
    worded in no flag, by name alone: it said `train.outer_lr must be positive` to a user who
    typed --outer-lr."""
    said = str(error)
    typed = [flag for key, flag in flags.items() if flag not in said and any(
        re.search(rf"(?<![\w.-]){re.escape(name)}\b", said)
        for name in (key, key.partition(".")[2])[:1 if "--" in said else 2])]
    return UserError(f"{', '.join(typed)}: {said}") if typed else error


def _build(factory, values: dict[str, Any], section: str):
    try:
        return typed_dataclass(factory, values, section)
    except ValueError as e:
        raise UserError(str(e)) from None


def write_whole(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a part:
    under torchrun rank 0 rewrites a resumed run's config.yaml and plan.json while a rank that
    started later may be reading them."""
    path = Path(path)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)
