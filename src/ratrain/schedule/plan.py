"""A pipeline plan: the per-stage programs of one training step and the choices that made them.

`build_plan` composes a builder (the compute order) with the passes of a policy and checks the
result; `PipelinePlan.to_dict`/`from_dict` write and read it as plain JSON-able data, programs in
their text form. Data-parallel replicas run the same programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ratrain.schedule import builders, passes
from ratrain.schedule.checks import validate
from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Program, format_program, parse_program

SCHEDULES: dict[str, tuple[str, Callable[[list[range], int], list[Program]]]] = {
    "1f1b": ("1F1B", builders.one_f_one_b),
    "gpipe": ("GPipe", builders.gpipe),
}
ACTIVATIONS = ("keep", "recompute")
RANK_ORDERS = ("pp-dp", "dp-pp")


@dataclass
class PipelinePlan:
    pp: int
    dp: int
    n_micro: int
    stage_units: list[range]
    """Stage s owns units [start, stop): 0 = embedding, 1..n = decoder blocks, n+1 = head."""
    programs: list[Program]
    """One program per pipeline stage, for one optimizer step."""
    policy: str
    schedule: str
    activation: str
    clip: bool
    rank_order: str = "pp-dp"
    """Placement of the grid on global ranks: "pp-dp" (a stage's replicas are neighbouring
    ranks) or "dp-pp" (one replica's stages are). It changes no program, only which traffic
    runs between neighbours (under torchrun: inside a node)."""

    @property
    def n_layers(self) -> int:
        return self.stage_units[-1].stop - 2

    def validate(self) -> None:
        """Run every check (checks.validate); call it on a plan read from a file before use."""
        validate(self.programs, self.stage_units, self.n_micro, self.dp)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pp": self.pp,
            "dp": self.dp,
            "n_micro": self.n_micro,
            "stage_units": [[r.start, r.stop] for r in self.stage_units],
            "programs": [format_program(p) for p in self.programs],
            "policy": self.policy,
            "schedule": self.schedule,
            "activation": self.activation,
            "clip": self.clip,
            "rank_order": self.rank_order,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelinePlan:
        return cls(
            pp=d["pp"],
            dp=d["dp"],
            n_micro=d["n_micro"],
            stage_units=[range(start, stop) for start, stop in d["stage_units"]],
            programs=[parse_program(text) for text in d["programs"]],
            policy=d["policy"],
            schedule=d["schedule"],
            activation=d["activation"],
            clip=d["clip"],
            rank_order=d.get("rank_order", "pp-dp"),
        )


def _compute_and_p2p(programs: list[Program], stage_units: list[range], n_layers: int,
                     activation: str) -> list[Program]:
    """What both policies share: one activation policy for every decoder block (keep all, or
    recompute each), then the pipeline transfers."""
    recompute = set(range(1, n_layers + 1)) if activation == "recompute" else set()
    programs = passes.add_activation_policy(programs, recompute)
    return passes.add_p2p(programs, stage_units)


def _baseline(programs: list[Program], stage_units: list[range], n_layers: int, dp: int,
              activation: str, clip: bool) -> list[Program]:
    """GPU-style: one activation policy for every unit (keep all, or recompute every decoder
    block); every gradient synchronized after the pipeline flush; one optimizer step at the end;
    parameter views resident (no view actions)."""
    programs = _compute_and_p2p(programs, stage_units, n_layers, activation)
    programs = passes.add_grad_sync(programs, stage_units, dp)
    return passes.add_update(programs, stage_units, clip)


def _ratrain(programs: list[Program], stage_units: list[range], n_layers: int, dp: int,
             activation: str, clip: bool) -> list[Program]:
    """The training-state lifecycle, per unit and per stage: each unit's gradient sync starts
    right after its last backward and is waited as late as possible; each unit is updated
    after its own sync (after the global norm when clipping), no stage waiting for another
    except for that norm. Activation policy as in the baseline for now; parameter views
    resident."""
    programs = _compute_and_p2p(programs, stage_units, n_layers, activation)
    programs = passes.add_unit_grad_sync(programs, dp)
    return passes.add_unit_update(programs, stage_units, dp, clip)


POLICIES = {"ratrain": _ratrain, "baseline": _baseline}


def _choice(kind: str, value: str, known) -> None:
    if value not in known:
        raise ScheduleConfigError(f"unknown {kind} {value!r}; choose one of {', '.join(known)}")


def build_plan(
    n_layers: int,
    pp: int,
    dp: int,
    n_micro: int,
    schedule: str = "1f1b",
    policy: str = "ratrain",
    activation: str = "keep",
    units_per_stage: list[int] | None = None,
    clip: bool = True,
    rank_order: str = "pp-dp",
) -> PipelinePlan:
    """Build and check the programs of one training step.

    `n_micro` is the number of micro-batches per step per data-parallel replica; it must be at
    least `pp`, or some stage would idle through the whole step's steady state.
    """
    _choice("schedule", schedule, SCHEDULES)
    _choice("policy", policy, POLICIES)
    _choice("activation policy", activation, ACTIVATIONS)
    _choice("rank order", rank_order, RANK_ORDERS)
    if dp < 1:
        raise ScheduleConfigError(f"dp must be >= 1, got {dp}")
    if n_micro < 1:
        raise ScheduleConfigError(f"n_micro must be >= 1, got {n_micro}")
    stage_units = builders.partition_units(n_layers, pp, units_per_stage)
    name, builder = SCHEDULES[schedule]
    if n_micro < pp:
        raise ScheduleConfigError(
            f"n_micro={n_micro} is fewer than pp={pp} stages: {name} needs at least as many "
            f"micro-batches as stages; raise global_batch or lower micro_batch_size/dp"
        )
    programs = builder(stage_units, n_micro)
    programs = POLICIES[policy](programs, stage_units, n_layers, dp, activation, clip)
    validate(programs, stage_units, n_micro, dp)
    return PipelinePlan(pp, dp, n_micro, stage_units, programs, policy, schedule, activation, clip,
                        rank_order)


def build_eval_programs(stage_units: list[range], n_micro: int) -> list[Program]:
    """Evaluation programs: every forward with its activation transfers, then E (which reduces
    the loss over the stages). Checked before they are returned."""
    programs = passes.add_step_end(
        passes.add_p2p(builders.forward_only(stage_units, n_micro), stage_units)
    )
    validate(programs, stage_units, n_micro, dp=1, forward_only=True)
    return programs
