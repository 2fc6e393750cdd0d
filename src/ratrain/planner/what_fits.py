"""What would fit once the request changes, for the account of a search that found nothing
(account.py): the layouts that hold the least, whether one of them fits by the estimate, and
what more devices could do, within what the user pinned (--pp, --micro-batch-size) and what
the global batch allows."""

from __future__ import annotations

import dataclasses

from ratrain.byte_units import decimal_bytes
from ratrain.planner.layouts import Layout, PlanRequest, layouts, lifecycles
from ratrain.planner.node_memory import with_node_memory
from ratrain.planner.partition import fits
from ratrain.planner.unit_tables import UnitTables


def smallest_layouts(request: PlanRequest) -> list[Layout]:
    """Per pipeline degree and lifecycle, the layout that holds the least: micro-batches of one
    sequence (or the least --micro-batch-size pinned), and as many replicas as the devices
    allow (the fewest micro-batches in flight)."""
    sizes = (min(request.micro_batch_sizes),) if request.micro_batch_sizes else (1,)
    smallest: dict[tuple, Layout] = {}
    for layout in layouts(dataclasses.replace(request, micro_batch_sizes=sizes)):
        key = (layout.pp, layout.lifecycle, layout.activation, layout.rank_order)
        if key not in smallest or layout.n_micro < smallest[key].n_micro:
            smallest[key] = layout
    return list(smallest.values())


def fits_with(request: PlanRequest, **change) -> bool:
    """Whether some plan fits by the estimate once `change` is made to the request; more
    devices on a node share its memory (with_node_memory: 2 devices were each given the whole
    node, "2 devices would fit", and the 2-device search then refused)."""
    changed = dataclasses.replace(request, **change)
    if "devices" in change:
        changed = dataclasses.replace(changed, profile=with_node_memory(changed.profile,
                                                                        changed.devices))
    tables = UnitTables(changed)
    # the deepest pipelines and sharded state first: the likeliest to fit
    for layout in sorted(smallest_layouts(changed),
                         key=lambda lay: (-lay.pp, not lay.lifecycle.shard_state)):
        if fits(tables(layout), layout.activation):
            return True
    return False


def most_devices(request: PlanRequest, pipeline_degrees: tuple[int, ...] | None) -> int:
    """The most devices a layout can use to hold less per device: a stage needs a micro-batch
    of its own (1F1B, ZB-H1) and a replica a sequence, so pp x dp is at most the global batch;
    more replicas only help where the state can be sharded over them; stages hold a unit
    each at least; and the profile's devices, where it counts them."""
    g, n_units = request.global_batch, request.model.n_layers + 2
    shards = any(life.shard_state for life in lifecycles(request))
    most = 0
    for pp in pipeline_degrees or range(1, n_units + 1):
        replicas = [d for d in range(1, g + 1) if g % d == 0 and g // d >= pp]
        if pp <= n_units and replicas:
            most = max(most, pp * (max(replicas) if shards else 1))
    return min(most, request.profile.device_count or most)


def devices_hint(request: PlanRequest) -> str:
    """What more devices would do: the fewest (of 2, 4, ... times as many) that fit, keeping a
    pinned --pp or, where only another would fit, saying so; or why none would help."""
    r = request
    shards = any(life.shard_state for life in lifecycles(r))
    pinned = r.pipeline_degrees
    more = _fitting_devices(r, most_devices(r, pinned))
    if more:
        what = ("more replicas to shard the state over" if pinned else "more pipeline stages"
                + (" or replicas to shard the state over" if shards else ""))
        return f"{more} devices would fit ({what})"
    if pinned:
        freed = _fitting_devices(r, most_devices(r, None), pipeline_degrees=None)
        if freed:
            return (f"{freed} devices would fit with more pipeline stages than --pp "
                    f"{_degrees(pinned)} allows: leave --pp out for the search to choose")
    return _no_more_devices(r, shards)


def _fitting_devices(request: PlanRequest, most: int, **change) -> int | None:
    for devices in sorted({min(most, request.devices * k) for k in (2, 4, 8, 16, 32)}):
        if devices > request.devices and fits_with(request, devices=devices, **change):
            return devices
    return None


def _degrees(pinned: tuple[int, ...]) -> str:
    return "/".join(str(p) for p in pinned)


def _no_more_devices(request: PlanRequest, shards: bool) -> str:
    """Why more devices would not make a plan fit."""
    r, n_units = request, request.model.n_layers + 2
    pin = f" with --pp {_degrees(r.pipeline_degrees)}" if r.pipeline_degrees else ""
    most = most_devices(r, r.pipeline_degrees)
    unlimited = min(n_units * (r.global_batch if shards else 1),
                    r.profile.device_count or n_units * r.global_batch)
    if most < unlimited:  # the global batch (or the pin) bounds what a layout can use
        if r.devices >= most:
            return (f"more devices would not help: at global batch {r.global_batch}{pin} no "
                    f"layout uses more than {most} device{'s' if most > 1 else ''} (a stage "
                    f"needs a micro-batch of its own, a replica a sequence)")
        return (f"more devices alone would not fit it: even the {most}{pin} that a layout of "
                f"global batch {r.global_batch} can use at most overfill{_node_share(r, most)}")
    if r.devices >= most:
        return "more devices would not help: every stage already holds one unit"
    if r.devices >= n_units:
        return ("more devices would not help: every stage already holds one unit, and sharding "
                f"the state over more replicas (up to {most} devices) does not fit either")
    return ("more devices alone would not fit it: even one unit per stage overfills"
            + (", with its state sharded" if shards else "") + _node_share(r, most))


def _node_share(request: PlanRequest, devices: int) -> str:
    """Where `devices` share a node's memory, a phrase that says each one's share: the account
    of one device that fits 2 stages' worth otherwise reads as wrong."""
    shared = with_node_memory(request.profile, devices)
    if shared is request.profile or (request.budget is not None
                                     and request.budget <= shared.device.memory_bytes):
        return ""  # (a budget asked for below the share is what holds them)
    held = decimal_bytes(shared.device.memory_bytes)
    return f" (each holds {held}, its share of the node's memory)"


PINS = (("pipeline_degrees", "--pp"), ("micro_batch_sizes", "--micro-batch-size"),
        ("grad_lifetimes", "--grad-lifetime"))
"""The request's fields that a flag pins, and the flag."""


def pinned_hints(request: PlanRequest) -> list[str]:
    """Per flag pinned, where it alone keeps every plan out: the search without it finds one
    that fits (a user who pinned it would otherwise read the account as the budget's)."""
    hints = []
    for field, flag in PINS:
        pinned = getattr(request, field)
        if pinned and fits_with(request, **{field: None}):
            hints.append(f"without {flag} {'/'.join(map(str, pinned))} a plan fits: leave it "
                         f"out for the search to choose")
    return hints
