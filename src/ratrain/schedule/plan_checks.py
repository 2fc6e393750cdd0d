"""The checks of a plan read from a file (PipelinePlan.validate): its programs (checks.validate),
its activation choice and micro-batch groups against what the programs do, and its lifecycle
fields (sharding, hybrid groups, gradient lifetime, carried updates, tied embeddings across
stages, gradients summed on the device) against the programs and each other."""

from __future__ import annotations

from ratrain.schedule import outer_sync
from ratrain.schedule.activation_choice import activation_done, check_choice
from ratrain.schedule.checks import validate
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ops import Op
from ratrain.schedule.plan_rules import (SPLIT_SCHEDULES, UPDATES, check_carried_update,
                                         check_device_grad_sum, check_device_units,
                                         check_host_grad, check_hybrid, check_sharding)
from ratrain.schedule.tied_sync import check_tied
from ratrain.schedule.unit_major import check_group, check_order
from ratrain.schedule.weight_grads import CAPPED, WEIGHT_GRADS, parse_placement


def check_plan(plan) -> None:
    """Raise ScheduleError where the programs fail a check (checks.validate, for every outer
    sync variant), the activation choice is not what they do, or a field and the programs
    disagree or the fields clash."""
    if not plan.pp == len(plan.programs) == len(plan.stage_units):
        raise ScheduleError(f"pp={plan.pp}, but the plan has {len(plan.programs)} programs "
                            f"for {len(plan.stage_units)} stages")
    if not isinstance(plan.shard_state, bool):
        raise ScheduleError(f"shard_state must be true or false, got {plan.shard_state!r}")
    if plan.weight_grad is not None:
        parse_placement(plan.weight_grad)
    if (plan.weight_grad is None) != (plan.schedule not in SPLIT_SCHEDULES):
        raise ScheduleError(f"weight_grad {plan.weight_grad!r} does not fit schedule "
                            f"{plan.schedule!r} (a split schedule takes one of "
                            f"{', '.join(WEIGHT_GRADS)} or {CAPPED}; the others none)")
    outer_sync.check_outer(plan.sync, plan.dp, plan.policy, plan.shard_state,
                           plan.stage_units[-1].stop, plan.shard_group)
    for programs in [plan.programs, *outer_sync.every_variant(plan)]:
        validate(programs, plan.stage_units, plan.n_micro, plan.grad_sync_dp,
                 shared=plan.shared_views)
    check_group(plan.micro_batch_group, plan.n_micro, plan.pp, plan.schedule)
    wrong = plan.micro_batch_group > 1 and check_order(
        plan.programs, plan.stage_units, plan.n_micro, plan.micro_batch_group)
    if wrong:
        raise ScheduleError(wrong)
    done = activation_done(plan.programs, plan.stage_units, plan.n_micro)
    if plan.activation != done:
        raise ScheduleError(f"the plan's activation {plan.activation} is not what its "
                            f"programs do: {done}")
    _check_lifecycle(plan)


def _check_lifecycle(plan) -> None:
    """Raise ScheduleError where a field and the programs disagree, or the fields clash."""
    check_sharding(plan.shard_state, plan.dp, plan.state_home, plan.view_window,
                   plan.grad_lifetime, plan.policy)
    check_hybrid(plan.shard_group, plan.shard_state, plan.dp, plan.policy)
    check_choice("update", plan.update, UPDATES)
    carried = any(a.op is Op.START_UPDATE for program in plan.programs for a in program)
    if carried != (plan.update == "carried"):
        raise ScheduleError(f"update {plan.update!r}, but the programs "
                            f"{'do' if carried else 'do not'} carry the updates (SU/WU)")
    check_carried_update(plan.update, plan.shard_state, plan.sync)
    check_device_units(plan.device_units, plan.state_home, plan.stage_units[-1].stop)
    check_host_grad(plan.host_grad_dtype, plan.state_home, plan.shard_state, plan.view_window)
    inline = {a.unit for program in plan.programs for a in program if a.op is Op.UPDATE}
    if carried and inline != set(plan.device_units):
        raise ScheduleError(f"carried updates, but the programs update units {sorted(inline)} "
                            f"inline, not the device units {list(plan.device_units)}")
    check_tied(plan.tie_embeddings, plan.pp, plan.shard_state, plan.sync)
    tied = {s for s, program in enumerate(plan.programs)
            if any(a.op is Op.TIED_SYNC for a in program)}
    if tied != set(plan.tied_ends):
        raise ScheduleError(f"tie_embeddings {plan.tie_embeddings} over {plan.pp} stages, but "
                            f"the programs of stages {sorted(tied)} sum a tied weight's "
                            f"gradient (TS)")
    crossed = any(a.op is Op.CROSS_SYNC for program in plan.programs for a in program)
    if crossed != (plan.shard_group is not None):
        raise ScheduleError(f"shard_group {plan.shard_group}, but the programs "
                            f"{'do' if crossed else 'do not'} sum the shards across the "
                            f"groups (GX)")
    reduced = any(a.op is Op.GRAD_REDUCE for program in plan.programs for a in program)
    if reduced != (plan.grad_lifetime == "micro-batch" and plan.dp > 1):
        raise ScheduleError(f"grad_lifetime {plan.grad_lifetime!r}, but the programs "
                            f"{'do' if reduced else 'do not'} reduce each micro-batch's "
                            f"gradient (RS)")
    if plan.shard_state:
        for s, (program, units) in enumerate(zip(plan.programs, plan.stage_units)):
            viewed = {a.unit for a in program if a.op is Op.PREFETCH}
            if set(units) - viewed:
                raise ScheduleError(f"sharded state, but stage {s}'s program makes no view of "
                                    f"units {sorted(set(units) - viewed)}")
    check_device_grad_sum(plan.device_grad_sum, plan.state_home, plan.dp, plan.shard_state,
                          plan.sync, plan.policy, plan.view_window, plan.n_micro,
                          plan.micro_batch_group)
