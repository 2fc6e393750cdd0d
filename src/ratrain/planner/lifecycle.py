"""A plan's lifecycle choices besides activations and the schedule: where a stage's state lives,
how its parameter views are made, and, for sharded state, how long the full-size gradient lives
and over which replicas the state is sharded. planner/layouts.py enumerates them; the unit table
(planner/unit_table.py) prices a stage's units under one."""

from __future__ import annotations

from dataclasses import dataclass

from ratrain.counts import counted


@dataclass(frozen=True)
class Lifecycle:
    """Where state lives and how parameter views are made: the choices a stage's memory
    depends on besides its activations."""

    state_home: str  # "device" or "host"
    view_window: int | None  # None: no views (they are the masters); 0: resident; K: window
    policy: str  # "ratrain" or "baseline"
    shard_state: bool = False  # masters and AdamW state sharded over the replicas (device, views)
    grad_lifetime: str = "step"  # sharded: how long a unit's full-size gradient lives
    shard_group: int | None = None  # hybrid sharding: replicas per shard group (a node's)
    micro_batch_group: int = 1  # unit-major groups of micro-batches (schedule/unit_major.py)
    host_grad_dtype: str = "float32"  # host-homed: the gradient accumulation's (PipelinePlan's)

    def label(self, on_device: int = 0, summed_on_device: bool = False) -> str:
        """The state home and views as the plan table shows them: "device, sharded / window 1",
        "device, sharded, grad transient / window 1" (a lifetime shorter than the step),
        "device, sharded in 4s / resident" (hybrid: within groups of 4 replicas), "host, 2
        units on device / window 1" (`on_device`: a plan's device units, planner/device_units.py),
        "host, summed on device / window 1, groups of 8" (`summed_on_device`: the plan's
        device_grad_sum), "device / no views" (the masters themselves compute)."""
        views = ("no views" if self.view_window is None
                 else "resident" if self.view_window == 0 else f"window {self.view_window}")
        sharded = ""
        if self.shard_state:
            sharded = (", sharded" + (f" in {self.shard_group}s" if self.shard_group else "")
                       + (f", grad {self.grad_lifetime}" if self.grad_lifetime != "step" else ""))
        grouped = f", groups of {self.micro_batch_group}" if self.micro_batch_group > 1 else ""
        units = f", {counted(on_device, 'unit')} on device" if on_device else ""
        summed = ", summed on device" if summed_on_device else ""
        low = ", bf16 grad" if self.host_grad_dtype == "bfloat16" else ""
        return f"{self.state_home}{units}{summed}{low}{sharded} / {views}{grouped}"
