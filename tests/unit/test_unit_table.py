"""The planner's unit table prices the embedding, one block and the head, and lets that block
stand for every block: held here against the cost model pricing every unit, over models,
lifecycles, profiles and replica counts."""

from __future__ import annotations

import pytest

from ratrain.models.presets import get_preset
from ratrain.planner.lifecycle import Lifecycle
from ratrain.planner.unit_table import UnitTable
from ratrain.schedule.ir import Action, Op
from ratrain.sim import unit_costs as uc
from ratrain.sim.profile import load_profile

LIFECYCLES = [
    Lifecycle("device", None, "ratrain"),
    Lifecycle("host", 1, "ratrain"),
    Lifecycle("device", 1, "ratrain", shard_state=True, grad_lifetime="transient"),
    Lifecycle("device", 0, "ratrain", shard_state=True, grad_lifetime="micro-batch"),
    Lifecycle("host", 2, "ratrain", micro_batch_group=2),
    Lifecycle("device", None, "baseline"),
]


def _every_unit(table: UnitTable) -> dict[str, list]:
    """What the table holds, priced unit by unit as the cost model prices it."""
    c, units, o = table.costs, range(table.n_units), table.costs.overhead
    shape, model = c.s.shape, table.model
    views = table.lifecycle.view_window is not None
    owners = [c.unit_state_owners(u) for u in units]
    return {
        "forward": [c.forward(u) + o for u in units],
        "forward_no_grad": [c.forward(u, with_grad=False) + o for u in units],
        "_whole": [c.backward(u) + o for u in units],
        "_weight": [c.backward_weight(u) + o for u in units],
        "saved": [uc.saved_bytes(shape, uc.unit_kind(model, u)) for u in units],
        "out": [uc.output_bytes(shape, uc.unit_kind(model, u)) for u in units],
        "state": [sum(owner[3] for owner in own) for own in owners],
        "full": [sum(n for _, n in c.storages("grad_full", Action(Op.BACKWARD, u, 0)))
                 for u in units],
        "view": [c.view_bytes(u) if views else 0 for u in units],
        "_seeds": [sum(n for _, n in c.storages("wgrad_seeds", Action(Op.BACKWARD_INPUT, u, 0)))
                   for u in units],
    }


@pytest.mark.parametrize("preset, profile, dtype, dp", [
    ("tiny", "cpu-local", "float32", 1), ("tiny-alibi", "cpu-local", "float32", 2),
    ("tiny-llama3", "h100-80g-ib", "bfloat16", 4), ("llama2-7b", "mt3000", "float16", 8),
    ("llama3.2-1b", "a100-40g-10gbe", "bfloat16", 2),
])
def test_a_block_stands_for_every_block(preset, profile, dtype, dp):
    model, hw = get_preset(preset), load_profile(profile)
    for lifecycle in LIFECYCLES:
        table = UnitTable(model, hw.for_group(0) if hw.groups else hw, 2, 128, dtype, 4,
                          lifecycle, True, dp=dp if lifecycle.shard_state else 1)
        for name, want in _every_unit(table).items():
            assert getattr(table, name) == want, (preset, lifecycle, name)
