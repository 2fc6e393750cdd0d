"""A candidate of the planner's search: a layout, its partition (each stage with its activation
choice) and the lower bound it is queued with; `evaluate` builds it into a plan and simulates
it, which gives its step time and each stage's peak bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ratrain.planner.layouts import Layout, PlanRequest, needs_device_grad_sum
from ratrain.planner.partition import Partition
from ratrain.schedule.plan import PipelinePlan, build_plan
from ratrain.sim.result import SimResult
from ratrain.sim.simulator import simulate
from ratrain.setup.rule import update_for


@dataclass
class Candidate:
    layout: Layout
    partition: Partition
    bound: float
    plan: PipelinePlan | None = None
    result: SimResult | None = None
    stage_bytes: list[float] = field(default_factory=list)  # simulated device peak + overhead
    host_bytes: list[float] = field(default_factory=list)  # simulated host-tier peak
    refined: bool = False  # `bound` is `refine`'s
    device_units: tuple[int, ...] = ()  # host-homed: units kept on the device (device_units.py);
    # none given: those the stages' choices keep there (StageChoice.on_device)

    @property
    def step_time(self) -> float:
        return self.result.step_time if self.result else float("inf")

    @property
    def key(self) -> tuple:
        return self.layout, tuple((a, b, est.choice) for a, b, est in self.partition)

    def excess(self, request: PlanRequest) -> float:
        """Bytes by which the worst stage overfills its device (or its host tier)."""
        if not self.stage_bytes:
            return float("inf")
        return max(max(b - request.limit_of(g), h - request.host_limit_of(g))
                   for b, h, g in zip(self.stage_bytes, self.host_bytes, self.layout.groups))

    def shortfall(self, request: PlanRequest) -> float:
        """The most by which a stage over its device's limit, as simulated, holds more than
        its estimate: what the estimates of the layout's stages must leave free for the next
        partition of it to fit, where the estimates fall short by as much again."""
        over = [b - est.bytes for b, g, (_, _, est) in
                zip(self.stage_bytes, self.layout.groups, self.partition)
                if b > request.limit_of(g)]
        return max(over, default=0.0)

    def choices(self, n_units: int) -> list[str]:
        return [est.choice.label(range(a, b), n_units) for a, b, est in self.partition]


def build(request: PlanRequest, candidate: Candidate) -> PipelinePlan:
    layout, n_units = candidate.layout, request.model.n_layers + 2
    unit_activation = {}
    for a, b, est in candidate.partition:
        unit_activation.update(est.choice.per_unit(range(a, b), n_units))
    activation = "keep" if layout.activation == "mixed" else layout.activation
    return build_plan(request.model.n_layers, layout.pp, layout.dp, layout.n_micro,
                      policy=layout.lifecycle.policy, activation=activation,
                      units_per_stage=[b - a for a, b, _ in candidate.partition], clip=request.clip,
                      rank_order=layout.rank_order, view_window=layout.lifecycle.view_window,
                      state_home=layout.lifecycle.state_home,
                      unit_activation=unit_activation if layout.activation == "mixed" else None,
                      check=False, shard_state=layout.lifecycle.shard_state,
                      schedule=layout.schedule, weight_grad=layout.weight_grad,
                      grad_lifetime=layout.lifecycle.grad_lifetime,
                      tie_embeddings=request.model.tie_embeddings,
                      shard_group=layout.lifecycle.shard_group,
                      micro_batch_group=layout.lifecycle.micro_batch_group,
                      update=update_for("auto", layout.lifecycle.state_home,
                                        layout.lifecycle.shard_state,
                                        request.profile.device.host_link is not None,
                                        request.sync),
                      device_units=candidate.device_units or tuple(
                          u for a, _, est in candidate.partition
                          for u in range(a, a + est.choice.on_device)),
                      sync=request.sync, host_grad_dtype=layout.lifecycle.host_grad_dtype,
                      device_grad_sum=needs_device_grad_sum(
                          request, layout.lifecycle.state_home, layout.dp))


def evaluate(request: PlanRequest, candidate: Candidate) -> Candidate:
    """Build the candidate's plan and simulate it."""
    candidate.plan = build(request, candidate)
    candidate.device_units = tuple(candidate.plan.device_units)
    candidate.result = simulate(candidate.plan, request.model, request.profile,
                                micro_batch_size=candidate.layout.micro_batch_size,
                                seq_len=request.seq_len, dtype=request.dtype,
                                threads_per_rank=request.threads_of(candidate.layout))
    devices = [request.device(g) for g in candidate.layout.groups]
    candidate.stage_bytes = [r.peak_with_process(d)
                             for r, d in zip(candidate.result.ranks, devices)]
    candidate.host_bytes = [r.host_peak for r in candidate.result.ranks]
    return candidate
