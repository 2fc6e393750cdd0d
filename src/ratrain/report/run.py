"""What the report reads from a run directory, and the simulated step it sets beside the
measured one."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.run_config import run_config


@dataclass
class Run:
    run_dir: Path
    cfg: RunConfig
    metrics: list[dict]
    summary: dict
    plan: object | None = None  # the PipelinePlan that ran (plan.json), if the executor ran one
    plan_file: dict | None = None  # the --plan file's contents (its prediction), when readable
    trace: dict | None = None  # trace.json (Chrome trace format)
    notes: list[str] = field(default_factory=list)  # what the report could not show, and why
    no_plan: str = ""  # why `plan` is None, in words
    plain_engine: bool = False  # a single process that LocalEngine ran: no plan, no trace

    @property
    def budget_bytes(self) -> float | None:
        return ((self.plan_file or {}).get("prediction") or {}).get("budget_bytes")


def _json(path: Path):
    return _read_json(path)[0]


def _read_json(path: Path) -> tuple[object, str | None]:
    """(the file's contents, None) or (None, why it could not be read; None if it is absent)."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{path.name} could not be read ({type(e).__name__}: {e})"


_NUMBER, _TEXT = "a number", "text"
_NUMBER_OR_NULL = "a number or null"
SUMMARY_TYPES = {
    "steps": _NUMBER, "final_loss": _NUMBER, "val_loss": _NUMBER, "tokens_per_s": _NUMBER,
    "tokens_per_s_of_steps": _TEXT, "peak_memory_bytes": _NUMBER, "mfu": _NUMBER,
    "peak_flops": _NUMBER, "flops_per_token": _NUMBER, "peak_flops_source": _TEXT,
    "threads_per_rank": _NUMBER, "ledger_peak_bytes_per_stage": [_NUMBER],
    "rss_growth_bytes_per_stage": [_NUMBER], "ledger_at_peak_by_kind_per_rank": [dict]}
"""What the report reads of summary.json, as training/run_summary.write_summary writes it
(null: a value it did not know); [x]: a list of x."""

ROW_TYPES = {
    "loss": _NUMBER, "val_loss": _NUMBER, "tokens_per_s": _NUMBER, "step_time_s": _NUMBER,
    "mfu": _NUMBER, "peak_memory_bytes": _NUMBER, "loss_per_replica": [_NUMBER_OR_NULL],
    "loss_per_island": [_NUMBER_OR_NULL], "peak_memory_bytes_per_rank": [_NUMBER_OR_NULL],
    "ledger_peak_bytes_per_rank": [_NUMBER], "rss_growth_bytes_per_rank": [_NUMBER]}
"""What the report reads of a metrics.jsonl row beside its step (which read_metrics checks),
as MetricsLog writes it (null: a float that was not finite); a list's null, where the report
reads one as no value. A wrong one was drawn as it was (a loss of "abc" as a category on the
loss axis) or ended the report in a TypeError."""

ROW_KEYS = ("loss", "tokens_per_s")
"""The keys of every row (training/loop.py), which the curves read of each."""


def _wrong_type(summary) -> str | None:
    """What in `summary` (summary.json's contents) is not of the type the report reads, in
    words; None if nothing is."""
    if not isinstance(summary, dict):
        return f"it holds {type(summary).__name__}, not an object"
    return _wrong_value(summary, SUMMARY_TYPES)


def _wrong_value(data: dict, types: dict) -> str | None:
    """The first key of `types` whose value in `data` is not of its type, in words."""
    for key, want in types.items():
        value = data.get(key)
        if value is None:
            continue
        if isinstance(want, list):
            if not isinstance(value, list):
                return f"its {key} is {value!r}, not a list"
            wrong = [v for v in value if not _is(v, want[0])]
            if wrong:
                return f"its {key} holds {wrong[0]!r}, not {_said(want[0])}"
        elif not _is(value, want):
            return f"its {key} is {value!r}, not {_said(want)}"
    return None


def _checked_rows(log: Path) -> list[dict]:
    """metrics.jsonl's rows, each of the types the report reads; a MetricsDamaged naming the
    line and the key of the first that is not, as read_metrics names a line that is not JSON."""
    from ratrain.training.metrics import MetricsDamaged, numbered_rows

    # a line that is not a row: a MetricsDamaged, saying where (a last one cut short after
    # rows is left out)
    rows = numbered_rows(log, lone_line_damaged=True)
    for n, row in rows:
        wrong = next((f"it has no {key}" for key in ROW_KEYS if key not in row), None)
        wrong = wrong or _wrong_value(row, ROW_TYPES)
        if wrong:
            raise MetricsDamaged(f"{log} is damaged: line {n}: {wrong}; correct or remove "
                                 "that line")
    return [row for _, row in rows]


def _is(value, want) -> bool:
    if want == _NUMBER_OR_NULL:
        return value is None or _is(value, _NUMBER)
    if want == _NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str) if want == _TEXT else isinstance(value, want)


def _said(want) -> str:
    return want if isinstance(want, str) else "an object"


def runs_a_plan(cfg: RunConfig) -> bool:
    """Whether the run ran a pipeline plan, which it wrote to plan.json: every run of more
    than one rank, and a single process that needs the executor (training/prepare.prepare)."""
    from ratrain.runtime.engine import needs_executor

    return cfg.parallel.pp * cfg.parallel.dp > 1 or needs_executor(cfg)


def load_run(run_dir: str | Path) -> Run:
    """The run in `run_dir`; a UserError if it is not a ratrain run directory that has taken a
    step."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise UserError(f"{run_dir} has no metrics.jsonl: the run has not taken a step")
    metrics = _checked_rows(run_dir / "metrics.jsonl")  # a damaged one: a UserError, saying where
    if not metrics:
        raise UserError(f"{run_dir}/metrics.jsonl is empty: the run has not taken a step")
    summary, unreadable = _read_json(run_dir / "summary.json")
    wrong = _wrong_type(summary) if summary is not None else None
    if wrong:  # as a file cut short is: the report's figures take its values as they are
        summary, unreadable = None, f"summary.json could not be read ({wrong})"
    run = Run(run_dir, cfg, metrics, summary or {})
    if not run.summary:
        run.notes.append((unreadable or "no summary.json (the run did not reach its end)")
                         + ": figures from metrics.jsonl")
    plan = _load_plan(run)
    if run.cfg.parallel.plan_file:  # the run's copy holds the file's prediction (2026-11-27 on)
        given = Path(run.cfg.parallel.plan_file)
        run.plan_file = plan if plan and "prediction" in plan else _json(given)
        wrong = _wrong_plan(run.plan_file, given.name) if run.plan_file is not plan else None
        if run.plan_file is None or wrong:
            run.plan_file = None
            run.notes.append(f"the plan file {given} "
                             + (f"could not be read ({wrong})" if wrong else "is gone")
                             + ": no budget, no planner's prediction")
    run.trace, unreadable = _read_json(run_dir / "trace.json")
    if run.trace is None:
        run.notes.append("no measured step timeline: " + (unreadable or _no_trace(run)))
    return run


def _load_plan(run: Run) -> dict | None:
    """Reads RUN/plan.json into `run`; returns its contents where they have a plan's shape."""
    plan, unreadable = _read_json(run.run_dir / "plan.json")
    wrong = _wrong_plan(plan, "plan.json") if plan is not None else None
    if wrong:  # as a file cut short is: a hand-edited value once ended the report in a traceback
        plan, unreadable = None, f"plan.json could not be read ({wrong})"
    if plan is not None:
        from ratrain.schedule.plan import PipelinePlan

        try:
            run.plan = PipelinePlan.from_dict(plan)
            return plan
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            unreadable = f"plan.json could not be read ({type(e).__name__}: {e})"
    run.plain_engine = not unreadable and not runs_a_plan(run.cfg)
    run.no_plan = ("a single process on the plain engine (no pipeline plan)" if run.plain_engine
                   else unreadable or "plan.json is missing")
    return plan


def _wrong_plan(data, name: str) -> str | None:
    """What in `data` (the contents of the plan file `name`) is not of a plan's shape
    (setup/plan_file_shape.py), in words without the file's name, which the note says, nor
    the advice to make a new plan, which is `train --plan`'s; None if nothing is."""
    from ratrain.setup.plan_file_shape import REMAKE, check_plan_shape

    if not isinstance(data, dict):
        return f"it holds {type(data).__name__}, not an object"
    try:
        check_plan_shape(data, name)
    except UserError as e:
        return str(e).removeprefix(f"{name}: ").removesuffix(f"; {REMAKE}")
    budget = data.get("prediction", {}).get("budget_bytes")
    if not _is(budget, _NUMBER_OR_NULL):  # the memory figure's line and the table's
        return f"its prediction.budget_bytes is {budget!r}, not a number"
    return None


def _no_trace(run: Run) -> str:
    """Why a run directory has no trace.json."""
    if not run.summary:
        return "the run did not reach its end, where trace.json is written"
    if run.plain_engine:
        return "no trace.json (a single process on the plain engine records none)"
    return "no trace.json (the run was made with --no-trace, or the file was removed)"


def plans_profile(plan_data: dict | None) -> tuple[str | None, str | None]:
    """(the profile a `ratrain plan` file was made on, as `load_profile` takes it; its name)
    from the file's prediction: a measured profile's YAML where its recorded path still holds
    one, else its name (a preset's loads; a moved YAML's does not). (None, None) without one."""
    prediction = (plan_data or {}).get("prediction") or {}
    made_on, its_file = prediction.get("profile"), prediction.get("profile_file")
    if not isinstance(made_on, str):
        return None, None
    if isinstance(its_file, str) and Path(its_file).is_file():
        return its_file, made_on
    return made_on, made_on


def profile_spec(run: Run, given: str | None) -> str | None:
    """The hardware profile to simulate the run's plan on: the one given, the run's
    (--profile), or the one its plan was made with."""
    return given or run.cfg.train.profile or plans_profile(run.plan_file)[0]


class Simulated(NamedTuple):
    result: object  # the SimResult
    profile: str  # the profile's name
    of: str  # which step's programs, in words; "" where every step's are the same


def simulate_run(run: Run, given_profile: str | None, step: int | None = None):
    """A Simulated of the run's plan at `step` (as metrics.jsonl counts it; under --sync diloco
    a step's programs may hold an outer sync: schedule/outer_sync.step_programs), None: a step
    of its inner programs; or None with a note on why not."""
    from ratrain.schedule.outer_sync import parse_sync, step_programs
    from ratrain.sim.profile import load_profile
    from ratrain.sim.simulator import simulate

    if given_profile:
        load_profile(given_profile)  # a profile asked for by name that does not load: say so
    if run.plan is None:
        run.notes.append(f"no simulated step: {run.no_plan}")
        return None
    spec = profile_spec(run, given_profile)
    if not spec:
        run.notes.append("no simulated step: no hardware profile; pass --profile (to "
                         "`ratrain train` or `ratrain report`), e.g. --profile cpu-local")
        return None
    plan, of = run.plan, ""  # `of`: which step, where steps differ (--sync diloco)
    if parse_sync(plan.sync) is not None:
        of = "a step without an outer sync"
        if step is not None:
            programs = step_programs(plan, step - 1, run.cfg.train.steps)
            synced = programs is not plan.programs
            of = f"step {step}, {'with its' if synced else 'no'} outer sync"
            plan = dataclasses.replace(plan, programs=programs)
    # the ranks' threads as the run had them (summary.json's since 2026-11-27; one before);
    # a run that did not reach its end wrote no summary: its --threads, where given
    threads = (run.summary.get("threads_per_rank") if run.summary
               else run.cfg.parallel.threads_per_rank)
    if threads is None and not run.summary:
        run.notes.append("the simulated step computes on one thread per rank: the run's threads "
                         "are recorded in summary.json, which it did not write")
    try:
        hw = load_profile(spec)
        t = run.cfg.train
        result = simulate(plan, run.cfg.model, hw, micro_batch_size=t.micro_batch_size,
                          seq_len=t.seq_len, dtype=t.dtype, threads_per_rank=int(threads or 1))
    except UserError as e:
        run.notes.append(f"no simulated step: {e}")
        return None
    return Simulated(result, hw.name, of)
