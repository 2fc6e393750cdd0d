"""A CPU node's memory is its devices' to share: each of N devices searched, simulated or
hinted at holds at most device.node_memory_bytes / min(N, devices_per_node). Here, in the
planner, because its account's "N devices would fit" must hold each of the N to that share
(it gave 2 devices the whole node, and the 2-device search then refused); the command line's
search and simulate take it from here (cli/plan_search.with_node_memory)."""

from __future__ import annotations

import dataclasses

from ratrain.counts import counted


def with_node_memory(hw, devices: int):
    """The profile `hw` with each CPU device's memory at most its share of its node's
    (device.node_memory_bytes / min(devices, devices_per_node)), for a search or simulation of
    `devices`: as cli/plan_search.with_this_machines_memory shares this machine's. A measured
    CPU profile's memory_bytes is the RAM over the ranks it measured with, so one of --ranks 1
    gave each of 2 searched devices the whole RAM (pp=2 planned 27.4 GB on a machine of 25.3
    GB). Unchanged (the same object) without node memory (presets, profiles before 2026-12-03)
    or on a GPU (memory of its own)."""
    on_node = max(1, min(devices, hw.devices_per_node))

    def shared(device):
        node = device.node_memory_bytes
        if node is None or device.host_link is not None or device.memory_bytes <= node / on_node:
            return device
        return dataclasses.replace(device, memory_bytes=node / on_node)
    devices_now = [hw.device, *(g.device for g in hw.groups)]
    if all(shared(d) is d for d in devices_now):
        return hw
    node = max(d.node_memory_bytes or 0.0 for d in devices_now)
    notes = {**hw.notes, "device.memory_bytes": f"the node's memory ({node / 1e9:.2f} GB, "
             f"device.node_memory_bytes) shared by the {counted(on_node, 'device')} on it"}
    return dataclasses.replace(hw, device=shared(hw.device), notes=notes, groups=[
        dataclasses.replace(g, device=shared(g.device)) for g in hw.groups])
