"""Activation recovery as a plan states it: the choice per stage and unit (keep, recompute,
offload) from what the user asked, what the programs do, and the baseline's one-policy rule.
"""

from __future__ import annotations

from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Op, Program

ACTIVATIONS = ("keep", "recompute", "offload")


def by_unit(stage_units: list[range], activation: list[list[str]]) -> dict[int, str]:
    return {u: choice for units, choices in zip(stage_units, activation)
            for u, choice in zip(units, choices)}


def activation_done(programs: list[Program], stage_units: list[range],
                     n_micro: int) -> list[list[str]]:
    """What the programs do per unit: "recompute" where every micro-batch has R, "offload" where
    every one has O, "keep" where none has either; anything else is named by what it mixes."""
    def done(program: Program, u: int) -> str:
        recomputed = {a.mb for a in program if a.op is Op.RECOMPUTE and a.unit == u}
        offloaded = {a.mb for a in program if a.op is Op.OFFLOAD and a.unit == u}
        if not recomputed and not offloaded:
            return "keep"
        if len(recomputed) == n_micro and not offloaded:
            return "recompute"
        if len(offloaded) == n_micro and not recomputed:
            return "offload"
        return f"recompute {sorted(recomputed)}, offload {sorted(offloaded)}"

    return [[done(program, u) for u in units] for program, units in zip(programs, stage_units)]


def resolve_activation(activation: str | list[str], unit_activation: dict[int, str] | None,
                        stage_units: list[range]) -> list[list[str]]:
    """The choice per stage per unit: `activation` for every decoder block, or one entry per
    stage for that stage's decoder blocks; the embedding and the head keep; `unit_activation`
    overrides any unit."""
    pp, n_units = len(stage_units), stage_units[-1].stop
    per_stage = [activation] * pp if isinstance(activation, str) else list(activation)
    if len(per_stage) != pp:
        raise ScheduleConfigError(
            f"activation {per_stage} has {len(per_stage)} entries for pp={pp}; give one policy, "
            f"or one per stage")
    overrides = unit_activation or {}
    for choice in per_stage + list(overrides.values()):
        check_choice("activation policy", choice, ACTIVATIONS)
    for u in overrides:
        if not 0 <= u < n_units:
            raise ScheduleConfigError(
                f"unit_activation names unit {u}, but the model has units 0..{n_units - 1}")
    return [[overrides.get(u, choice if 0 < u < n_units - 1 else "keep") for u in units]
            for choice, units in zip(per_stage, stage_units)]


def check_choice(kind: str, value: str, known) -> None:
    if value not in known:
        raise ScheduleConfigError(f"unknown {kind} {value!r}; choose one of {', '.join(known)}")


def check_baseline(activation: str | list[str], resolved: list[list[str]],
                    stage_units: list[range], view_window: int | None) -> None:
    """The baseline is GPU-style: one activation policy for every decoder block (the embedding
    and the head keep), parameter views resident."""
    asked = {activation} if isinstance(activation, str) else set(activation)
    uniform = resolve_activation(by_unit(stage_units, resolved)[1], None, stage_units)
    if len(asked) > 1 or resolved != uniform:
        raise ScheduleConfigError(
            f"baseline takes one activation policy for every decoder block, got {resolved} "
            f"(per stage, per unit); use --policy ratrain for per-stage choices")
    if view_window is not None and view_window >= 1:
        raise ScheduleConfigError(
            f"baseline keeps parameter views resident (view_window None or 0), got "
            f"view_window={view_window}; --view-window needs --policy ratrain")
