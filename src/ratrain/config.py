"""Configuration dataclasses: model (model_config.py), data, training, parallelism
(parallel_config.py); YAML/JSON in and out.

The global batch belongs to TrainConfig and never changes with pp/dp: parallelism only changes
who computes it, never the math.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ratrain.counts import model_units
from ratrain.errors import UserError
from ratrain.field_errors import FieldError, check_finite_field, led_by_flags
from ratrain.model_config import ModelConfig
from ratrain.parallel_config import AUTO_SCHEDULE, AUTO_UPDATE, MAX_COMM_TIMEOUT_S, ParallelConfig
from ratrain.plain_data import parse_error, shown, typed_dataclass, unknown_keys

# (the names other modules import from here: the parallel section's, kept where they were)
__all__ = ["AUTO_SCHEDULE", "AUTO_UPDATE", "DTYPES", "MAX_COMM_TIMEOUT_S", "DataConfig",
           "ModelConfig", "ParallelConfig", "RunConfig", "TrainConfig", "write_whole"]

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class DataConfig:
    path: str | None = None  # None: the running Python's standard library (*.py)
    tokenizer: str = "byte"  # "byte", or a tokenizer.json file / a directory holding one
    val_fraction: float = 0.05
    cache_dir: str | None = None  # None: ~/.cache/ratrain (or $RATRAIN_CACHE)

    def validate(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise FieldError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}",
                             "data.val_fraction")


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

    def validate(self, typed: Collection[str] = ()) -> None:
        """`typed`: the keys ("train.micro_batch_size") that flags gave (RunConfig.take_flag)."""
        # a NaN passes every comparison below, an inf most: each is refused by name first
        for name in ("lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "adam_eps",
                     "grad_clip", "outer_lr", "outer_momentum", "outer_mix"):
            check_finite_field(f"train.{name}", getattr(self, name))
        for name in ("seq_len", "global_batch", "micro_batch_size", "steps", "lr", "adam_eps",
                     "keep_checkpoints", "outer_lr"):
            if getattr(self, name) <= 0:
                raise FieldError(f"train.{name} must be positive, got {getattr(self, name)}",
                                 f"train.{name}")
        for name in ("warmup_steps", "weight_decay", "grad_clip", "eval_every",
                     "eval_batches", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise FieldError(f"train.{name} must be >= 0, got {getattr(self, name)}",
                                 f"train.{name}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise FieldError(f"train.min_lr must be in [0, train.lr] ([0, {self.lr}]), got "
                             f"{self.min_lr}",
                             "train.min_lr", "train.lr")
        for name in ("beta1", "beta2", "outer_momentum", "outer_mix"):
            if not 0 <= getattr(self, name) < 1:
                raise FieldError(f"train.{name} must be in [0, 1), got {getattr(self, name)}",
                                 f"train.{name}")
        if self.global_batch % self.micro_batch_size:
            # (told to one who typed --micro-batch-size 2, "the default" was wrong)
            hint = (" (the default: set --micro-batch-size)"
                    if self.micro_batch_size == type(self).micro_batch_size
                    and "train.micro_batch_size" not in typed else "")
            raise FieldError(f"train.global_batch {self.global_batch} is not a multiple of "
                             f"train.micro_batch_size {self.micro_batch_size}{hint}",
                             "train.global_batch", "train.micro_batch_size")
        if self.dtype not in DTYPES:
            raise FieldError(f"train.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}",
                             "train.dtype")
        if self.checkpoint_dir is not None and not self.checkpoint_dir.strip():
            raise FieldError("train.checkpoint_dir must name a directory, got an empty string",
                             "train.checkpoint_dir")


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
        first) and the planner apply. A refusal of a value a flag gave names the flag (by the
        fields a FieldError carries: field_errors.py)."""
        flags = vars(self).get("_flags", {})
        try:
            self.model.validate()
            self.data.validate()
            self.train.validate(flags)
            self.parallel.validate()
            self._check_partition()
            if self.train.seq_len > self.model.max_seq_len:
                raise FieldError(f"train.seq_len {self.train.seq_len} exceeds the model's "
                                 f"max_seq_len {self.model.max_seq_len}", "train.seq_len")
        except UserError as e:  # a FieldError where a section's value is refused
            raise led_by_flags(e, flags) from None

    def _check_partition(self) -> None:
        """--partition against the model's units: refused here, where the model is known (every
        schedule refused it alike, said as "no schedule can run this layout: units_per_stage
        [1, 1] sums to 2" without naming the flag)."""
        counts = self.parallel.partition
        if counts is None:
            return
        given = ",".join(map(str, counts))
        n_units = self.model.n_units
        if any(k < 1 for k in counts):
            raise FieldError(f"--partition {given}: every stage needs at least one unit",
                             "parallel.partition")
        if sum(counts) != n_units:
            raise FieldError(f"--partition {given} places {sum(counts)} units; the model has "
                             f"{n_units} ({model_units(self.model.n_layers)}): the counts must "
                             f"sum to {n_units}", "parallel.partition")

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
        try:  # a resumed run's RUN/config.yaml was never named (the user typed RUN)
            return cls.from_dict(d or {})
        except UserError as e:
            raise UserError(f"{path}: {e}") from None


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
    try:
        part.write_text(text)
        os.replace(part, path)
    except BaseException:  # a full disk, a Ctrl-C: the part was left beside the file
        try:
            part.unlink(missing_ok=True)
        except OSError:
            pass  # the write's own error is the one to tell
        raise


def append_whole(path: str | Path, data: bytes) -> None:
    """Append `data` to `path` unbuffered, and where a write fails part way (a full disk), cut
    the file back to its size before, then raise the OSError (if the cut fails too, the part
    stays: its readers leave a cut last record out)."""
    with Path(path).open("ab", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            done = 0
            while done < len(data):  # a raw write may take only part of it
                done += f.write(data[done:])
        except OSError:
            try:
                f.truncate(size)
            except OSError:
                pass
            raise
