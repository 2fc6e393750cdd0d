"""What the report reads from a run directory, and the simulated step it sets beside the
measured one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.errors import UserError


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

    @property
    def budget_bytes(self) -> float | None:
        return ((self.plan_file or {}).get("prediction") or {}).get("budget_bytes")


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_run(run_dir: str | Path) -> Run:
    """The run in `run_dir`; a UserError if it is not a finished ratrain run directory."""
    from ratrain.training.metrics import read_metrics

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} is not a ratrain run directory (no config.yaml)")
    if not (run_dir / "metrics.jsonl").is_file():
        raise UserError(f"{run_dir} has no metrics.jsonl: the run has not taken a step")
    try:
        metrics = read_metrics(run_dir / "metrics.jsonl")
    except ValueError as e:
        raise UserError(f"{run_dir}/metrics.jsonl is damaged: {e}") from None
    if not metrics:
        raise UserError(f"{run_dir}/metrics.jsonl is empty: the run has not taken a step")
    run = Run(run_dir, RunConfig.load(run_dir / "config.yaml"), metrics,
              _json(run_dir / "summary.json") or {})
    if not run.summary:
        run.notes.append("no summary.json (the run did not finish): figures from metrics.jsonl")
    plan = _json(run_dir / "plan.json")
    if plan:
        from ratrain.schedule.plan import PipelinePlan

        try:
            run.plan = PipelinePlan.from_dict(plan)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            run.notes.append(f"plan.json could not be read ({type(e).__name__}: {e})")
    if run.cfg.parallel.plan_file:  # the run's copy holds the file's prediction (2026-11-27 on)
        run.plan_file = (plan if plan and "prediction" in plan else
                         _json(Path(run.cfg.parallel.plan_file)))
        if run.plan_file is None:
            run.notes.append(f"the plan file {run.cfg.parallel.plan_file} is gone: no budget, "
                             "no planner's prediction")
    run.trace = _json(run_dir / "trace.json")
    return run


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


def simulate_run(run: Run, given_profile: str | None):
    """(SimResult, profile name) of the run's plan, or None with a note on why not."""
    if run.plan is None:
        run.notes.append("no simulated step: the run has no pipeline plan (a single process on "
                         "the plain engine)")
        return None
    spec = profile_spec(run, given_profile)
    if not spec:
        run.notes.append("no simulated step: no hardware profile; pass --profile (to "
                         "`ratrain train` or `ratrain report`), e.g. --profile cpu-local")
        return None
    from ratrain.sim.profile import load_profile
    from ratrain.sim.simulator import simulate

    if given_profile:
        load_profile(given_profile)  # a profile asked for by name that does not load: say so
    try:
        hw = load_profile(spec)
        t = run.cfg.train
        # the ranks' threads as the run had them (recorded since 2026-11-27; one before)
        result = simulate(run.plan, run.cfg.model, hw, micro_batch_size=t.micro_batch_size,
                          seq_len=t.seq_len, dtype=t.dtype,
                          threads_per_rank=int(run.summary.get("threads_per_rank", 1)))
    except UserError as e:
        run.notes.append(f"no simulated step: {e}")
        return None
    return result, hw.name
