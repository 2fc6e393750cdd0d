"""The policies: which passes (passes.py, grad_passes.py, view_passes.py) a builder's
compute-only programs go through, in which order (passes.py lists them), for each of the
policies build_plan (plan.py) offers: `ratrain`, the training-state lifecycle per unit, and
`baseline`, GPU-style.
"""

from __future__ import annotations

from ratrain.schedule import grad_passes, passes
from ratrain.schedule.ir import Program
from ratrain.schedule.view_passes import add_views


def _compute_and_p2p(programs: list[Program], stage_units: list[range],
                     activation: dict[int, str]) -> list[Program]:
    """What both policies start with: each unit's activation policy, then the pipeline
    transfers."""
    programs = passes.add_activation_policy(programs, activation)
    return passes.add_p2p(programs, stage_units)


def _baseline(programs: list[Program], stage_units: list[range], dp: int,
              activation: dict[int, str], clip: bool, view_window: int | None,
              grad_lifetime: str = "step", shard_group: int | None = None,
              shared: dict[int, int] | None = None, early_waits: bool = False) -> list[Program]:
    """GPU-style: one activation policy for every decoder block (build_plan refuses per-stage
    choices); every gradient synchronized after the pipeline flush; one optimizer step at the
    end (after the global norm when `clip`); parameter views resident (window None or 0)."""
    programs = _compute_and_p2p(programs, stage_units, activation)
    programs = grad_passes.add_grad_sync(programs, stage_units, dp)
    programs = grad_passes.add_update(programs, stage_units, clip)
    return add_views(programs, stage_units, view_window, shared)


def _ratrain(programs: list[Program], stage_units: list[range], dp: int,
             activation: dict[int, str], clip: bool, view_window: int | None,
             grad_lifetime: str = "step", shard_group: int | None = None,
             shared: dict[int, int] | None = None, early_waits: bool = False) -> list[Program]:
    """The training-state lifecycle, per unit and per stage: each unit recovers its
    activations as chosen for it (keep, recompute, or offload and reload); each unit's gradient
    sync starts right after its last backward and is waited as late as possible; each unit is
    updated after its own sync (after the global norm when `clip`), no stage waiting for another
    except for that norm; parameter views prefetched within the window ahead of use and
    released after it (view_window K >= 1), or resident. A gradient lifetime shorter than the
    step waits for each sync after one more compute action (it frees the full-size gradient);
    "micro-batch" reduces each micro-batch's gradient right after its backward. So does
    `early_waits` (a gradient summed on the device: PipelinePlan.device_grad_sum). Hybrid
    sharding (`shard_group`) sums each shard across the groups after its last sync. `shared`:
    the views a unit computes with besides its own (a tied head's: the embedding's)."""
    programs = _compute_and_p2p(programs, stage_units, activation)
    if grad_lifetime == "micro-batch":
        programs = grad_passes.add_micro_batch_grad_sync(programs, dp)
    else:
        programs = grad_passes.add_unit_grad_sync(programs, dp)
    if grad_lifetime != "step" or early_waits:
        programs = grad_passes.add_early_sync_waits(programs)
    programs = grad_passes.add_unit_update(programs, stage_units, dp, clip)
    if shard_group is not None:
        programs = grad_passes.add_cross_sync(programs)
    return add_views(programs, stage_units, view_window, shared)


POLICIES = {"ratrain": _ratrain, "baseline": _baseline}
