"""The step x stage table of programs that a failed check prints, as
torch.distributed.pipelining's _format_pipeline_order does."""

from __future__ import annotations

from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ir import Program

_TABLE_CONTEXT = 6  # steps shown around each marked one when a table is long
_TABLE_ROWS = 80  # tables longer than this are cut to the marked steps and their context


def format_table(programs: list[Program], marks: dict[int, int] | None = None) -> str:
    """Step x stage table (as torch.distributed.pipelining's _format_pipeline_order): row i
    holds each stage's i-th action; `marks` maps a stage to the step whose action is marked.
    Long tables keep only the steps near a mark."""
    marks = marks or {}
    cells = [[str(a) for a in program] for program in programs]
    for stage, step in marks.items():
        cells[stage][step] = f">>{cells[stage][step]}<<"
    n_steps = max((len(c) for c in cells), default=0)
    if n_steps <= _TABLE_ROWS:
        shown = list(range(n_steps))
    elif marks:
        shown = sorted({
            i for step in marks.values()
            for i in range(max(0, step - _TABLE_CONTEXT), min(n_steps, step + _TABLE_CONTEXT + 1))
        })
    else:
        shown = list(range(_TABLE_ROWS))
    # a plan's programs are its stages', which every replica runs: under --dp a column is not
    # one rank (pp-dp order puts stage 1 of replica 0 at rank dp)
    headers = [f"Stage {s}" for s in range(len(programs))]
    widths = [max([len(h)] + [len(c) for c in col]) for h, col in zip(headers, cells)]
    digits = len(str(max(n_steps - 1, 0)))
    label = " " * (len("Step ") + digits + 2)
    lines = [label + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    previous = -1
    for i in shown:
        if i != previous + 1:
            lines.append("...")
        row = [(col[i] if i < len(col) else "").ljust(w) for col, w in zip(cells, widths)]
        lines.append(f"Step {i:0{digits}d}: " + "  ".join(row).rstrip())
        previous = i
    if shown and shown[-1] != n_steps - 1:
        lines.append(f"... ({n_steps} steps in all)")
    return "\n".join(lines)


def fail(programs: list[Program], reason: str, marks: dict[int, int] | None = None) -> None:
    raise ScheduleError(f"{reason}\n{format_table(programs, marks)}")
