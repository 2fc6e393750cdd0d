"""The schedule layer: the program IR, builders, passes, checks and plans. Pure Python (no torch).

    ops          the op registry: what every op means (one spec per op)
    builders     compute-only programs (1F1B, GPipe, forward-only) and the unit partition
    passes       add pipeline communication and activation recovery
    grad_passes  add grad sync, its waits and the updates
    view_passes  add parameter views
    tied_sync    tied embeddings across stages: the sum of the two copies' gradients (TS, WTS)
    policies     which passes each policy runs, in which order
    checks       completeness, matching, dependencies and a deadlock-proving dry run
    view_checks  the views' lifetimes, and a weight two units share (a tied head's)
    plan         PipelinePlan and build_plan
    eval_programs  build_eval_programs
"""

from ratrain.schedule.builders import forward_only, gpipe, one_f_one_b, partition_units
from ratrain.schedule.checks import validate
from ratrain.schedule.errors import ScheduleConfigError, ScheduleError
from ratrain.schedule.ir import Action, Program, format_program, parse_program
from ratrain.schedule.ops import SPECS, WAIT_OF, Op, OpSpec
from ratrain.schedule.eval_programs import build_eval_programs
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.schedule.table import format_table

__all__ = [
    "SPECS", "WAIT_OF", "Action", "Op", "OpSpec", "PipelinePlan", "Program", "ScheduleConfigError", "ScheduleError",
    "build_eval_programs", "build_plan", "format_program", "format_table", "forward_only", "gpipe",
    "one_f_one_b", "parse_program", "partition_units", "validate",
]
