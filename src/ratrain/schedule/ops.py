"""The op registry: what every op of the program IR means, written once.

Each op has one `OpSpec`: its text code and operands, its class, whether it starts asynchronous
work and which op waits for it, the peers it talks to, how a point-to-point op pairs with its
peer's, and its effect on the memory ledger over abstract storages. The passes, the checks and
the dry run (schedule/), the executor (runtime/) and the cost model and simulator (sim/) read
this table and keep no list of ops of their own. Three tables hold one entry per op, each
checked complete at import: the executor's handlers (runtime/handlers.py), the cost model's
durations (sim/cost_model.py) and what an action needs before it on its own rank
(schedule/needs.py). A new op is one `Op` member, one spec here, one handler, one cost, one
rule of what it needs.

Memory effects name storages relative to the action (`input` of `F u.m` is unit u's input on
micro-batch m); the executor binds each name to real tensors, the simulator to sizes
(sim/cost_model.StageCosts.storages), and both apply the same effects in the same order
(ledger.apply_effects), so their ledgers agree by construction:

    kept            what F saves for its backward under the unit's policy (nothing if recomputed)
                    (owner "act", until B or BW; the output has an owner of its own, "out", which
                    B or BI releases: BI drops the output, BW still needs the rest)
    saved           what a forward with autograd saves (R)
    input, output   the unit's input (unit 0: the step's tokens) and output on the micro-batch
    saved_host      the host copies of `saved` (O);  saved_reloaded: the device copies again (L)
    received        RA's buffer: the previous stage's output, which becomes F's `input`
    output_grad     RG's buffer: the gradient of the unit's output
    input_grad      what B (or BI) produces: the gradient of the unit's input
    grad_full       the unit's full-size fp32 gradient accumulation where it lives only as long
                    as it must (sharded state, gradient lifetime "transient" or "micro-batch";
                    held per unit, not per micro-batch, from a backward until the sync that
                    reduces it has completed); where it lives for the whole step it is part of
                    the unit's state and binds to nothing here
    wgrad_seeds     what BI keeps for BW: the gradient of the output of each op of the unit
                    that reads a weight (unit 0, whose input is token ids: its output and its
                    output gradient, from which BW runs its whole backward)
    wgrad_saved     what BI keeps of the saved activations for BW: what the graph nodes BW
                    runs saved (the inputs of the ops that read a weight); BI was the last to
                    read the rest (unit 0: all of it, its BW is its whole backward)
    view            the unit's compute view (P)
    grad_run        a run's fp32 gradient sum on the device, held per unit until the run's
                    last backward folds it (host-homed on a GPU: schedule/unit_major.py), or
                    summed on the device, until the sync's wait folds it (device_grad_sum)
    outer_delta     the unit's outer delta (outer params - local params) while its all-reduce
                    is in flight (OS until WOS; --sync diloco, schedule/outer_sync.py)

This module is pure data: no torch.
"""

from __future__ import annotations

from ratrain.schedule.op_spec import (  # noqa: F401  (the registry's vocabulary, re-exported)
    Effect, Hold, Op, OpClass, OpSpec, Peer, Release, owner_key,
)


def _wait(start: Op, doc: str, **kw) -> OpSpec:
    spec = SPECS[start]
    return OpSpec(spec.waited_by, doc, spec.cls, unit=spec.unit, mb=spec.mb, peers=spec.peers,
                  in_eval=spec.in_eval, waits=start, **kw)



_HOLD_FULL_GRAD = Hold("fullgrad", "gradients", ("grad_full",), per_unit=True)
_RELEASE_FULL_GRAD = Release("fullgrad", per_unit=True)
_RUN_GRAD = (Release("rungrad", per_unit=True), Hold("rungrad", "buffers", ("grad_run",),
                                                     per_unit=True))

SPECS: dict[Op, OpSpec] = {spec.op: spec for spec in (
    OpSpec(Op.FORWARD, "Run one unit's forward on one micro-batch; keep what its backward needs "
           "(per policy).", OpClass.COMPUTE, in_eval=True,
           memory=(Hold("act", "activations", ("kept", "input")),
                   Hold("out", "activations", ("output",)),
                   Release("recv", -1))),
    OpSpec(Op.BACKWARD, "Backward of one unit on one micro-batch; accumulates that unit's "
           "parameter gradients and leaves the gradient of its input.", OpClass.COMPUTE,
           input_grad=True, weight_grad=True,
           memory=(*_RUN_GRAD, Release("grad"), Release("act"), Release("out"),
                   Release("offloaded"), Hold("grad", "buffers", ("input_grad",), -1),
                   _HOLD_FULL_GRAD)),
    OpSpec(Op.BACKWARD_INPUT, "The input half of a split backward of one unit on one "
           "micro-batch: the gradient of its input only (what the previous unit and stage wait "
           "for), keeping of the activations only what BW reads, and the gradients BW starts "
           "from (`wgrad_seeds`). "
           "Unit 0 (token ids in) has no input gradient: it keeps its output gradient for BW.",
           OpClass.COMPUTE, input_grad=True,
           memory=(Release("grad"), Release("out"), Release("act"),
                   Hold("act", "activations", ("wgrad_saved", "input")),
                   Hold("wgrad", "buffers", ("wgrad_seeds",)),
                   Hold("grad", "buffers", ("input_grad",), -1))),
    OpSpec(Op.BACKWARD_WEIGHT, "The weight half of a split backward: from what `BI u.m` kept, "
           "accumulate unit u's parameter gradients as B would (nothing but the unit's own "
           "sync waits for it), then free the micro-batch's activations.", OpClass.COMPUTE,
           weight_grad=True,
           memory=(*_RUN_GRAD, Release("wgrad"), Release("act"), Release("offloaded"),
                   _HOLD_FULL_GRAD)),
    OpSpec(Op.RECOMPUTE, "Re-run a unit's forward from its kept input, so the following "
           "backward has its graph.", OpClass.COMPUTE,
           memory=(Release("act"), Release("out"), Hold("act", "activations", ("saved", "input")),
                   Hold("out", "activations", ("output",)))),
    OpSpec(Op.SEND_ACT, "Start sending a unit's output activation to the next stage.",
           OpClass.P2P, waited_by=Op.WAIT_SEND_ACT, peers=(Peer.NEXT,), pairs_with=Op.RECV_ACT,
           sends=True, in_eval=True, eager=True),
    OpSpec(Op.RECV_ACT, "Post the receive of the previous stage's activation (the input of "
           "this stage's first unit).", OpClass.P2P, waited_by=Op.WAIT_RECV_ACT,
           peers=(Peer.PREV,), pairs_with=Op.SEND_ACT, in_eval=True,
           memory=(Hold("recv", "buffers", ("received",)),)),
    OpSpec(Op.SEND_GRAD, "Start sending the gradient of this stage's input back to the "
           "previous stage.", OpClass.P2P, waited_by=Op.WAIT_SEND_GRAD, peers=(Peer.PREV,),
           pairs_with=Op.RECV_GRAD, sends=True, eager=True),
    OpSpec(Op.RECV_GRAD, "Post the receive of the gradient of this stage's output from the "
           "next stage.", OpClass.P2P, waited_by=Op.WAIT_RECV_GRAD, peers=(Peer.NEXT,),
           pairs_with=Op.SEND_GRAD, memory=(Hold("grad", "buffers", ("output_grad",)),)),
    OpSpec(Op.GRAD_SYNC, "Start the data-parallel sync of one unit's accumulated gradients "
           "(all-reduce; sharded state: reduce-scatter).", OpClass.COLLECTIVE, mb=False,
           waited_by=Op.WAIT_GRAD_SYNC, peers=(Peer.REPLICAS,), eager=True),
    OpSpec(Op.GRAD_REDUCE, "Start reducing one micro-batch's gradient of a unit over the "
           "data-parallel replicas (sharded state, gradient lifetime \"micro-batch\": a "
           "reduce-scatter of the full-size gradient its B or BW just made; each replica gets "
           "its slice's sum).", OpClass.COLLECTIVE, waited_by=Op.WAIT_GRAD_REDUCE,
           peers=(Peer.REPLICAS,), eager=True),
    OpSpec(Op.CROSS_SYNC, "Start the all-reduce of unit u's shard gradient over the replicas "
           "that hold the same shard in the other shard groups (hybrid sharding: across nodes; "
           "within a group the reduce-scatter has summed it already).", OpClass.COLLECTIVE,
           mb=False, waited_by=Op.WAIT_CROSS_SYNC, peers=(Peer.REPLICAS,)),
    OpSpec(Op.GRAD_NORM, "Start reducing the stage's squared gradient norm over the pipeline "
           "group (for clipping by the global norm, and float16's overflow check); needs every "
           "gradient of the stage final and synchronized.", OpClass.COLLECTIVE, unit=False,
           mb=False, waited_by=Op.WAIT_GRAD_NORM, peers=(Peer.PIPELINE,)),
    OpSpec(Op.UPDATE, "Optimizer update of one unit (AdamW on its master weights), then zero "
           "its gradients; its view is stale after it.", OpClass.COMPUTE, mb=False),
    OpSpec(Op.START_UPDATE, "Start unit u's optimizer update (as U) on the rank's host update "
           "thread, with the step's learning rate and clipping coefficient; the walker goes "
           "on. Carried: the next step's program waits for it (WU u) before it first uses the "
           "unit, so the update runs beside the rest of this step and the start of the next.",
           OpClass.HOST, mb=False, waited_by=Op.WAIT_UPDATE, carried=True),
    OpSpec(Op.START_NORM, "Start finishing unit u's gradient on the rank's host update thread "
           "(the add of its last fold, where one is pending) and taking its squared norm, so "
           "that N only sums the units' norms (with carried updates and the global norm).",
           OpClass.HOST, mb=False, waited_by=Op.WAIT_NORM),
    OpSpec(Op.OFFLOAD, "Start copying the tensors `F u.m` saved for its backward to the host "
           "tier. No wait op: the executor tracks the copy and frees the device copy once the "
           "host copy has completed.", OpClass.COPY, eager=True,
           memory=(Release("act"), Hold("act", "activations", ("input",)),
                   Hold("offloaded", "offloaded", ("saved_host",)))),
    OpSpec(Op.RELOAD, "Start copying those tensors back from the host tier to the compute "
           "device, for `B u.m`.", OpClass.COPY, waited_by=Op.WAIT_RELOAD,
           memory=(Release("offloaded"), Hold("act", "activations", ("saved_reloaded",)))),
    OpSpec(Op.PREFETCH, "Start materializing unit u's compute view (compute dtype, on the "
           "compute device) from its master weights, into a buffer kept from an earlier step "
           "where there is one. The view is pending until its WP.", OpClass.COPY, mb=False,
           waited_by=Op.WAIT_PREFETCH, in_eval=True, view="pending",
           memory=(Hold("views", "views", ("view",)),)),
    OpSpec(Op.RELEASE, "Release unit u's compute view and free its buffer; the master stays "
           "in its home tier.", OpClass.STATE, mb=False, in_eval=True, view="released",
           memory=(Release("views"),)),
    OpSpec(Op.OUTER_SYNC, "Low-communication training (--sync diloco): take unit u's outer "
           "delta (its outer parameters minus this replica's local ones) and start summing it "
           "over the data-parallel replicas (with islands: this replica's slice of it, over "
           "the replicas of its place in the other islands).", OpClass.COLLECTIVE, mb=False,
           waited_by=Op.WAIT_OUTER_SYNC, peers=(Peer.REPLICAS,),
           memory=(Hold("outer", "optimizer", ("outer_delta",)),)),  # in the state's tier
    OpSpec(Op.TIED_SYNC, "Tied embeddings across stages: start summing the tied weight's "
           "gradient (the embedding's on the first stage, the head's copy of it on the last) "
           "over the replica's two stages that hold it, in place; after the unit's replica "
           "sync, so each copy's gradient is then the whole model's.", OpClass.COLLECTIVE,
           mb=False, waited_by=Op.WAIT_TIED_SYNC, peers=(Peer.TIED,)),
    OpSpec(Op.STEP_END, "End of the step: reduce the step's loss over every stage and replica "
           "(blocking; --sync diloco's inner steps: over the stages and the island only), read the step's "
           "device values once, reset per-step state.",
           OpClass.COLLECTIVE, unit=False, mb=False, peers=(Peer.PIPELINE, Peer.REPLICAS),
           in_eval=True),
)}
SPECS.update({spec.op: spec for spec in (
    _wait(Op.SEND_ACT, "Wait until that activation send has completed (its buffer may then "
          "be freed)."),
    _wait(Op.RECV_ACT, "Wait for that activation to arrive."),
    _wait(Op.SEND_GRAD, "Wait until that gradient send has completed.",
          memory=(Release("grad"),)),
    _wait(Op.RECV_GRAD, "Wait for that gradient to arrive."),
    _wait(Op.GRAD_SYNC, "Wait for that sync; the unit's gradients are then final and "
          "identical on all replicas (sharded: its shard's). A full-size gradient that lives "
          "only until its sync is freed; a run's sum summed on the device (device_grad_sum) "
          "folds into the host's accumulation and is freed.",
          memory=(_RELEASE_FULL_GRAD, _RUN_GRAD[0])),
    _wait(Op.GRAD_REDUCE, "Wait for that reduction, add the slice's sum to the shard's "
          "gradient and free the full-size one (the unit's next backward makes a new one).",
          memory=(_RELEASE_FULL_GRAD,)),
    _wait(Op.CROSS_SYNC, "Wait for that all-reduce; the shard's gradient is then the sum over "
          "every replica."),
    _wait(Op.GRAD_NORM, "Wait for that reduction; the clipping coefficient of the step is then "
          "known (as a device value: nothing is read on the host before E)."),
    _wait(Op.OUTER_SYNC, "Wait for that sum (with islands, then gather the island's slices "
          "of it); take the outer Nesterov step on the unit's outer parameters with the mean delta and merge the result into the local parameters "
          "(schedule/outer_sync.py says how).", memory=(Release("outer"),)),
    _wait(Op.TIED_SYNC, "Wait for that sum; both copies of the tied weight then have the same "
          "gradient, so their identical updates keep them equal."),
    _wait(Op.START_UPDATE, "Wait for the previous step's update of unit u (none before the "
          "first step); its masters are then current and a view may be made from them."),
    _wait(Op.START_NORM, "Wait for that unit's squared norm (before N sums them)."),
    _wait(Op.RELOAD, "Wait for that reload; the saved tensors are on the device again and "
          "`B u.m` may run."),
    _wait(Op.PREFETCH, "Wait for that view; it is then live (F, R and B of the unit may use "
          "it) until `X u`.", view="live"),
)})

WAIT_OF: dict[Op, Op] = {op: s.waited_by for op, s in SPECS.items() if s.starts}
CARRIED = frozenset(op for op, s in SPECS.items() if s.carried)
"""Starts whose wait is in the next step's program (SU)."""
"""Asynchronous start -> the op that waits for it."""
START_OF: dict[Op, Op] = {wait: start for start, wait in WAIT_OF.items()}
"""Wait op -> the start op it waits for."""

COMPUTE_OPS = frozenset(op for op, s in SPECS.items() if s.cls is OpClass.COMPUTE and s.mb)
"""F, R, B, BI, BW: the compute actions on a unit and micro-batch, which passes anchor on."""
INPUT_GRAD_OPS = frozenset(op for op, s in SPECS.items() if s.input_grad)
"""B, BI: consume the unit's output gradient and make its input's; R and WL go before them."""
WEIGHT_GRAD_OPS = frozenset(op for op, s in SPECS.items() if s.weight_grad)
"""B, BW: accumulate the unit's gradients; the last of them on a unit makes its gradient final."""

if set(SPECS) != set(Op) or any(SPECS[w].waits != s for s, w in WAIT_OF.items()):
    raise ImportError(f"op registry incomplete: no spec for {sorted(set(Op) - set(SPECS))}")


def peer_offset(op: Op) -> int:
    """The pipeline stage a point-to-point op talks to, relative to this one: -1 or +1."""
    peers = SPECS[op].peers
    return -1 if Peer.PREV in peers else +1 if Peer.NEXT in peers else 0


def exchanged_unit(op: Op, units: range) -> int:
    """The unit whose tensor a point-to-point op of a stage owning `units` moves: its last
    unit's output (with the next stage) or the previous stage's last unit's (its input)."""
    return units[-1] if peer_offset(op) > 0 else units[0] - 1


def spec(op: Op) -> OpSpec:
    return SPECS[op]
