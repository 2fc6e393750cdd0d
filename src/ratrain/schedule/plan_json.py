"""A pipeline plan's JSON form (schedule/plan.PipelinePlan.to_dict, from_dict): its fields as
plain data, programs in their text form; a field at its default is left out where older plans
had no such field, so they read as before."""

from __future__ import annotations

from typing import Any

from ratrain.schedule import outer_sync
from ratrain.schedule.activation_choice import resolve_activation
from ratrain.schedule.ir import format_program, parse_program


def plan_to_dict(plan) -> dict[str, Any]:
    """A PipelinePlan as JSON-able data."""
    return {
        "pp": plan.pp,
        "dp": plan.dp,
        "n_micro": plan.n_micro,
        "stage_units": [[r.start, r.stop] for r in plan.stage_units],
        "programs": [format_program(p) for p in plan.programs],
        "policy": plan.policy,
        "schedule": plan.schedule,
        "activation": plan.activation,
        "clip": plan.clip,
        "rank_order": plan.rank_order,
        "view_window": plan.view_window,
        "state_home": plan.state_home,
        "shard_state": plan.shard_state,
        # only where the backward is split: other plans read as before
        **({"weight_grad": plan.weight_grad} if plan.weight_grad else {}),
        **({"grad_lifetime": plan.grad_lifetime} if plan.grad_lifetime != "step" else {}),
        **({"shard_group": plan.shard_group} if plan.shard_group is not None else {}),
        **({"micro_batch_group": plan.micro_batch_group}
           if plan.micro_batch_group != 1 else {}),
        **({"sync": plan.sync} if plan.sync != outer_sync.EVERY_STEP else {}),
        **({"update": plan.update} if plan.update != "inline" else {}),
        **({"device_units": list(plan.device_units)} if plan.device_units else {}),
        **({"tie_embeddings": True} if plan.tie_embeddings else {}),
        **({"device_grad_sum": True} if plan.device_grad_sum else {}),
        **({"host_grad_dtype": plan.host_grad_dtype}
           if plan.host_grad_dtype != "float32" else {}),
    }


def plan_from_dict(plan_class, d: dict[str, Any]):
    """The `plan_class` (PipelinePlan) that plan_to_dict wrote. Older plans hold one activation
    string (the policy of every decoder block) and no view_window, state_home or shard_state
    (no view actions, masters on device, whole on every replica)."""
    stage_units = [range(start, stop) for start, stop in d["stage_units"]]
    activation = d["activation"]
    if isinstance(activation, str):
        activation = resolve_activation(activation, None, stage_units)
    return plan_class(
        pp=d["pp"], dp=d["dp"], n_micro=d["n_micro"], stage_units=stage_units,
        programs=[_program(s, text) for s, text in enumerate(d["programs"])],
        policy=d["policy"], schedule=d["schedule"], activation=activation, clip=d["clip"],
        rank_order=d.get("rank_order", "pp-dp"),
        view_window=d.get("view_window"),
        state_home=d.get("state_home", "device"),
        shard_state=d.get("shard_state", False),
        weight_grad=d.get("weight_grad"),
        grad_lifetime=d.get("grad_lifetime", "step"),
        shard_group=d.get("shard_group"),
        micro_batch_group=d.get("micro_batch_group", 1),
        sync=d.get("sync", outer_sync.EVERY_STEP),
        update=d.get("update", "inline"),
        device_units=tuple(d.get("device_units", ())),
        tie_embeddings=d.get("tie_embeddings", False),
        device_grad_sum=d.get("device_grad_sum", False),
        host_grad_dtype=d.get("host_grad_dtype", "float32"),
    )


def _program(stage: int, text: str):
    """Stage `stage`'s program, parsed; a ValueError names it (a hand edit of one of several)."""
    try:
        return parse_program(text)
    except ValueError as e:
        raise ValueError(f"programs[{stage}]: {e}") from None
