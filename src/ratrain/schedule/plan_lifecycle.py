"""A plan's lifecycle fields (sharding, hybrid groups, gradient lifetime, carried updates, tied
embeddings across stages) against what its programs do: PipelinePlan.validate's last checks, for
a plan read from a file."""

from __future__ import annotations

from ratrain.schedule.activation_choice import check_choice
from ratrain.schedule.errors import ScheduleError
from ratrain.schedule.ops import Op
from ratrain.schedule.plan_rules import (UPDATES, check_carried_update, check_device_units,
                                         check_hybrid, check_sharding)
from ratrain.schedule.tied_sync import check_tied


def check_lifecycle(plan) -> None:
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
