"""The run-config flags of where the state lives and how it is sharded (cli/options.py
splices them into the flags train, plan and simulate share)."""

from __future__ import annotations

import click

from ratrain.schedule.plan_rules import GRAD_LIFETIMES, HOST_GRAD_DTYPES

STATE_OPTIONS = [
    click.option("--view-window", type=int, help="Make each unit's compute view from its master at most this many units ahead of its use and release it after; 0 keeps all views resident. Only where views differ from masters (--dtype other than float32, --state-home host on a GPU, or --shard-state: the view is the gathered whole).  [default: 0]"),
    click.option("--state-home", type=click.Choice(["device", "host"]), help="Where fp32 masters, gradients and optimizer state live; host is pinned CPU memory on a GPU (on a CPU-only run, the same memory).  [default: device]"),
    click.option("--device-units", type=int, help="With --state-home host: the first K units of each stage (the embedding and blocks, in order) keep their fp32 masters, gradients and AdamW state on the compute device, updated there; the rest live on the host. Costs 16 bytes a parameter of device memory per unit, saves that unit's host-link traffic and host update. `ratrain plan --memory-budget` picks K where the budget allows.  [default: 0]"),
    click.option("--host-grad-dtype", type=click.Choice(HOST_GRAD_DTYPES), help="With --state-home host: what the host-homed units accumulate their gradients in. bfloat16 takes 2 bytes a parameter instead of 4 (13.5 GB less host memory at llama2-7b) and halves the gradients' trip across the host link; the update casts the gradient back to fp32 a chunk at a time before its AdamW (host work more), and each fold into it rounds to bfloat16, so the run is no longer bit for bit the float32 one: over 300 steps of `tiny` the validation loss ended 1.5-2.9% higher at 2 folds a step, 2.6-3.9% at 16 (docs/correctness.md).  [default: float32]"),
    click.option("--shard-state/--no-shard-state", default=None, help="Each data-parallel replica holds 1/dp of every unit's fp32 masters and AdamW state (ZeRO-style): gradients are reduce-scattered, each replica updates its slice, and the compute views are all-gathered. Needs --dp >= 2 and --state-home device.  [default: off]"),
    click.option("--grad-lifetime", type=click.Choice(GRAD_LIFETIMES), help="With --shard-state, how long each unit's full-size fp32 gradient lives: step (accumulated over the step, reduce-scattered once), transient (the same sync, but the buffer exists only from the unit's first backward to its reduce-scatter's end), micro-batch (each micro-batch's gradient reduce-scattered right after its backward: 1/dp of the memory, m times the traffic).  [default: step]"),
    click.option("--shard-group", type=int, help="With --shard-state, hybrid sharding: shard each unit's state within groups of this many neighbouring replicas (a node's) and replicate it across the groups, so only a shard's gradient crosses between them (an all-reduce per unit). Must divide --dp into at least two groups.  [default: shard over all --dp replicas]"),
]

STATE_FIELDS = {key: "parallel" for key in (
    "view_window", "state_home", "device_units", "host_grad_dtype", "shard_state",
    "grad_lifetime", "shard_group")}
