"""The setup stage's one entry: a run config (and its plan file, if any) in, the checked plan
that runs out. `ratrain train`, `ratrain plan`, `ratrain simulate` and the profiler's ranks
call it; the planner applies its rule (rule.py) to every layout it weighs.

In order: the config's values (config.validate), the plan file's fit to the run
(plan_file.py) or the flags' request, the rule of what can run here (rule.py), the schedule
where it is `auto` (choice.py, written into the config so the run records what was chosen),
and the plan itself, checked by the schedule checks. Every refusal is a UserError of one line.
Pure Python: what it needs of the machine comes in a `Machine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.errors import UserError
from ratrain.schedule.builders import first_units, partition_units
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.setup.choice import Choice, choose, default_profile
from ratrain.setup.links import MeasuredLinks, low_comm_hint, measured_profile
from ratrain.setup.memory_fit import machine_refusal
from ratrain.setup.plan_file import load_plan
from ratrain.setup.rule import check_runnable, device_grad_sum_for, has_views, update_for
from ratrain.sim.shared_cores import threads_of_rank


@dataclass(frozen=True)
class Machine:
    """What a plan depends on of where it runs."""

    host_is_separate: bool = False
    """The state's host tier is not the compute device's memory (a GPU's host)."""
    host_collectives: bool | None = None
    """The devices' collectives can reduce host buffers (a profile says; None: rule.refusal's
    default for the device)."""
    world: int | None = None
    """Processes already started for the run (torchrun's WORLD_SIZE); None where the run
    starts its own."""
    device_name: str | None = None
    """A GPU's name: the preset --schedule auto simulates on when the run names no profile."""
    memory_bytes: int | None = None
    """What a stage may hold, for --schedule auto (None: the profile's device memory)."""
    links: MeasuredLinks | None = None
    """A multi-node run's links, measured at its start: --schedule auto simulates on them
    (setup/links.py)."""
    host_available_bytes: int | None = None
    """The memory this machine has for the run's ranks here (Linux's MemAvailable at the
    start; None: not known): what memory_fit.check_memory_fits weighs the plan against."""
    local_ranks: tuple[int, ...] | None = None
    """The run's global ranks on this machine, which share its memory (None: all of them,
    where the run starts its own)."""
    threads_per_rank: int = 1
    """The CPU threads each rank computes on: --schedule auto simulates its candidates so."""
    cpu_bf16_flag: str | None = None
    """The CPU's bf16 matrix instructions (cpu_features.bf16_matmul_flag; None: none, or the
    devices are GPUs): the CPU preset then prices bf16 as fp32, not 15x slower."""

    @property
    def preset(self) -> str:
        """The hardware profile preset of this machine's devices: the CPU one, or the GPU
        family's (the H100 one for an unknown GPU)."""
        return default_profile((self.device_name or "GPU") if self.host_is_separate else None)

    def profile_or_preset(self, spec: str | None, dtype: str):
        """The profile `spec` names (a --profile), else this machine's preset_profile."""
        from ratrain.sim.profile import load_profile

        return load_profile(spec) if spec else self.preset_profile(dtype)

    def preset_profile(self, dtype: str):
        """The preset loaded (a HardwareProfile) for a run in `dtype`; for bf16 on a CPU that
        has bf16 matrix instructions, with bf16 at fp32's rate: measured there at 0.8-1.7x
        fp32's tokens/s, where the preset's AVX2 cores train it 15x slower (docs/machines.md)."""
        import dataclasses

        from ratrain.sim.profile import load_profile

        profile = load_profile(self.preset)
        compute = profile.device.compute
        if (dtype != "bfloat16" or self.host_is_separate or not self.cpu_bf16_flag
                or "float32" not in compute):
            return profile
        why = f"this CPU has {self.cpu_bf16_flag}: bfloat16 priced as float32"
        return dataclasses.replace(
            profile, name=f"{profile.name} ({why})",
            notes={**profile.notes, "device.compute.bfloat16": why},
            device=dataclasses.replace(profile.device,
                                       compute={**compute, "bfloat16": compute["float32"]}))

    @classmethod
    def of_profile(cls, profile, cfg: RunConfig) -> Machine:
        """The devices a HardwareProfile describes (what `ratrain simulate` predicts on), cfg's
        ranks on the threads `ratrain train` gives them there (threads_of_rank)."""
        return cls(host_is_separate=profile.device.host_link is not None,
                   host_collectives=profile.device.host_collectives,
                   threads_per_rank=threads_of_rank(profile, cfg.parallel.pp * cfg.parallel.dp,
                                                    cfg.parallel.threads_per_rank))


def run_plan(cfg: RunConfig, machine: Machine = Machine(), *, plan_data: dict | None = None,
             profile=None, say: Callable[[str], None] | None = None) -> PipelinePlan:
    """The checked plan of `cfg` on `machine`: its plan file's (`plan_data`: the file's
    contents, where already read), else the one its flags ask for, with its schedule chosen
    where it is `auto`: simulated on `profile` (a HardwareProfile; default: the run's
    --profile, else the preset of the machine's device), and `say` told why where there was a
    choice to make. Raises UserError where the run cannot go."""
    cfg.validate()
    if cfg.parallel.plan_file:
        plan = load_plan(cfg, plan_data)
        _check(cfg, machine, **{name: getattr(plan, name) for name in _PLAN_CHOICES})
        return plan
    if profile is None and machine.links is not None:
        profile, words = measured_profile(cfg, machine.links,
                                           machine.preset_profile(cfg.train.dtype))
        if say:
            say(words)
    choice = _choose_schedule(cfg, machine, profile)
    if say and choice and choice.candidates:
        say(choice.why)
    plan = _flags_plan(cfg, machine)
    if say and machine.links is not None:
        hint = low_comm_hint(cfg, plan, profile, machine.threads_per_rank)
        if hint:
            say(hint)
    return plan


_PLAN_CHOICES = ("n_layers", "pp", "dp", "schedule", "policy", "clip", "state_home",
                 "shard_state", "view_window", "grad_lifetime", "shard_group", "sync", "update",
                 "micro_batch_group", "device_grad_sum", "host_grad_dtype")
"""A plan's own layout and lifecycle, which the rule judges (a plan file's, not the flags')."""


def _check(cfg: RunConfig, machine: Machine, **choices) -> None:
    """The rule of what can run (rule.refusal) for these layout and lifecycle `choices` with
    cfg's batch, dtype and model on `machine`."""
    t = cfg.train
    check_runnable(global_batch=t.global_batch, micro_batch_size=t.micro_batch_size,
                   dtype=t.dtype, tie_embeddings=cfg.model.tie_embeddings,
                   host_is_separate=machine.host_is_separate,
                   host_collectives=machine.host_collectives, world=machine.world, **choices)


def _flag_choices(cfg: RunConfig, machine: Machine) -> dict:
    """The layout and lifecycle cfg's flags ask for, as a plan would hold them: clipping where
    the global norm is needed, a view window only where views differ from the masters."""
    p, t = cfg.parallel, cfg.train
    views = has_views(t.dtype, p.state_home, machine.host_is_separate, p.shard_state)
    return {"n_layers": cfg.model.n_layers, "pp": p.pp, "dp": p.dp, "schedule": p.schedule,
            "policy": p.policy,
            # float16 needs the global norm to see an overflow anywhere, clipping or not
            "clip": t.grad_clip > 0 or t.dtype == "float16",
            "state_home": p.state_home, "shard_state": p.shard_state,
            "view_window": p.view_window if views else None,
            "grad_lifetime": p.grad_lifetime, "shard_group": p.shard_group, "sync": p.sync,
            "update": update_for(p.update, p.state_home, p.shard_state, machine.host_is_separate,
                                 p.sync),
            "micro_batch_group": p.micro_batch_group, "host_grad_dtype": p.host_grad_dtype,
            "device_grad_sum": device_grad_sum_for(p.state_home, p.dp, p.sync,
                                                   machine.host_is_separate,
                                                   machine.host_collectives)}


def _flags_plan(cfg: RunConfig, machine: Machine) -> PipelinePlan:
    """The plan of cfg's flags (its schedule chosen), after the rule; a request the schedule
    cannot satisfy is a UserError too."""
    choices = _flag_choices(cfg, machine)
    _check(cfg, machine, **choices)
    p = cfg.parallel
    policies = p.activation_per_stage
    try:
        return build_plan(
            choices["n_layers"], p.pp, p.dp, cfg.n_micro, schedule=p.schedule, policy=p.policy,
            activation=policies[0] if len(policies) == 1 else policies,
            units_per_stage=p.partition, clip=choices["clip"], rank_order=p.rank_order,
            view_window=choices["view_window"], state_home=p.state_home,
            shard_state=p.shard_state, weight_grad=p.weight_grad, grad_lifetime=p.grad_lifetime,
            shard_group=p.shard_group, sync=p.sync, micro_batch_group=p.micro_batch_group or 1,
            update=choices["update"], tie_embeddings=cfg.model.tie_embeddings,
            device_grad_sum=choices["device_grad_sum"], host_grad_dtype=p.host_grad_dtype,
            device_units=_device_units(partition_units(choices["n_layers"], p.pp, p.partition),
                                       p.device_units))
    except ScheduleError as e:
        raise UserError(str(e)) from None


def _device_units(stage_units: list[range], k: int) -> tuple[int, ...]:
    """The units `--device-units k` keeps on the device; a k past every stage's units is
    refused rather than read as "all", which is what --state-home device asks for."""
    most = max(len(units) for units in stage_units)
    if k > most:
        raise UserError(f"--device-units {k} is more units than any stage has (the largest has "
                        f"{most}, its embedding or head included); {most} keeps all of them on "
                        f"the device, and --state-home device keeps every unit's state there")
    return first_units(stage_units, k)


def _device_budget(cfg: RunConfig, machine: Machine) -> float | None:
    """What a stage may hold on the device, for --schedule auto: a GPU's memory; on a CPU,
    where the device is the host, each local rank's share of the memory available (None:
    the profile's device memory)."""
    if machine.host_is_separate or machine.host_available_bytes is None:
        return machine.memory_bytes
    ranks = len(machine.local_ranks or range(cfg.parallel.pp * cfg.parallel.dp))
    return machine.host_available_bytes / ranks


def _choose_schedule(cfg: RunConfig, machine: Machine, profile) -> Choice | None:
    """Where cfg's schedule is `auto`, choose it (choice.py) and write the choice into cfg, so
    that the run records, and every rank runs, what was chosen. None where it was given."""
    if cfg.parallel.schedule != AUTO_SCHEDULE:
        return None
    _check(cfg, machine, **_flag_choices(cfg, machine))  # what cannot run is not simulated
    if profile is None:
        profile = machine.profile_or_preset(cfg.train.profile, cfg.train.dtype)
    choice = choose(cfg, lambda trial: _flags_plan(trial, machine), profile,
                    _device_budget(cfg, machine),
                    _flag_choices(cfg, machine)["view_window"] is not None,
                    lambda trial, plan: machine_refusal(trial, plan, machine),
                    machine.threads_per_rank)
    cfg.parallel.schedule, cfg.parallel.weight_grad = choice.schedule, choice.weight_grad
    cfg.parallel.micro_batch_group = choice.micro_batch_group
    return choice
