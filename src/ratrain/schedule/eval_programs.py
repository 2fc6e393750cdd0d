"""Evaluation programs: the forwards of a step with their activation transfers, without the
backward, the sync or the update (the engine's eval_loss runs them)."""

from __future__ import annotations

from ratrain.schedule import builders, passes
from ratrain.schedule.checks import validate
from ratrain.schedule.ir import Program
from ratrain.schedule.view_passes import add_views


def build_eval_programs(stage_units: list[range], n_micro: int,
                        view_window: int | None = None,
                        shared: dict[int, int] | None = None) -> list[Program]:
    """Evaluation programs: every forward with its activation transfers, then E (which reduces
    the loss over the stages), with parameter views as in training (`view_window`): evaluation
    runs after an update, so its views are made from the fresh masters; `shared`: the plan's
    (PipelinePlan.shared_views). Checked before they are returned."""
    programs = passes.add_step_end(
        passes.add_p2p(builders.forward_only(stage_units, n_micro), stage_units)
    )
    programs = add_views(programs, stage_units, view_window, shared)
    validate(programs, stage_units, n_micro, dp=1, forward_only=True, shared=shared)
    return programs
