"""A simulated stage's memory: its ledger (schedule/ledger.py), holding from the start the state
a stage keeps from one step to the next, to which each action the stage runs applies the op
registry's memory effects, sized by the cost model's storages (as the executor's ledger applies
them to real tensors); and what of it lives in a host tier apart from the device. Each change
is noted on the stage's timeline: bytes over time, the peak by kind, the device and host
peaks.

A stage's walker returns from its actions one after the other in program order, and each
action's effects apply when it returns: the ledger goes through the same states whatever the
timing. So the program is walked once (StageMemory), before any simulated step, and a step's
simulation only stamps each change with its time (MemoryClock): the planner simulates
thousands of plans, and several steps of those whose updates carry over."""

from __future__ import annotations

from ratrain.schedule.ir import Action
from ratrain.schedule.ledger import Ledger, apply_effects
from ratrain.schedule.ops import SPECS
from ratrain.sim.cost_model import StageCosts
from ratrain.sim.result import RankTimeline

STATE_KINDS = ("masters", "gradients", "optimizer")
"""A unit's training state's kinds: in the host tier where the state is homed there, on the
device for the units kept there (--device-units)."""


class StageMemory:
    def __init__(self, costs: StageCosts, program: list[Action], resident_views: bool):
        """`resident_views`: the plan's views stay allocated between steps (view window 0)."""
        self.costs = costs
        # What lives in the host tier, where it is not the device's own memory (a GPU's host;
        # a device without a host link, a CPU, has no host tier apart).
        self.host_kinds = (set() if costs.host_link is None else
                           {"offloaded"} | (set(STATE_KINDS)
                                            if costs.s.state_home == "host" else set()))
        self.ledger = Ledger()
        # the state of the units kept on the device, by kind: held for the run, in host kinds
        self.device_state = dict.fromkeys(self.host_kinds & set(STATE_KINDS), 0)
        for owner, kind, key, nbytes in costs.state_owners():
            self.ledger.hold_storage(owner, kind, key, nbytes)
            if kind in self.host_kinds and owner[1] in costs.s.device_units:
                self.device_state[kind] += nbytes
        if resident_views:
            for u in costs.s.view_units:
                self.ledger.hold_storage(("views", u), "views", ("view", u), costs.view_bytes(u))
        self.ledger.reset_peak()
        self.device_peak = self.host_peak = 0
        self.at_device_peak: dict[str, int] = {}  # what the device holds at its own peak
        self.note()
        self.at_start = self.ledger.total
        at_start = self.ledger.bytes
        self.held_before_training = at_start["masters"] + at_start["gradients"]
        self.changes = [self.record(a) for a in program]
        self.at_peak = dict(self.at_peak)

    def record(self, a: Action) -> int | None:
        """Apply action `a`'s memory effects: the bytes held after them, None if unchanged."""
        effects = SPECS[a.op].memory
        if not effects:  # most waits and collectives
            return None
        before = self.ledger.total
        costs = self.costs
        working = costs.working(a)
        if working:  # a compute action's peak: what it makes while it runs, on what is held
            self._note_device(working)
        # what a device unit's action holds of the state's kinds (its outer delta) is on the
        # device with the unit's state, as its state is (device_state)
        device_unit = bool(self.host_kinds) and a.unit in costs.s.device_units
        state_before = dict(self.ledger.bytes) if device_unit else None
        apply_effects(self.ledger, effects, a.unit, a.mb, lambda name: costs.storages(name, a))
        if device_unit:
            for k in self.device_state:
                self.device_state[k] += self.ledger.bytes[k] - state_before[k]
        if self.ledger.total == before:
            return None
        self.note()
        return self.ledger.total

    def note(self) -> None:
        ledger = self.ledger
        self.peak, self.at_peak = ledger.peak, ledger.at_peak  # the ledger replaces, never edits it
        on_host = self.on_host() if self.host_kinds else 0
        self._note_device(0, on_host)
        self.host_peak = max(self.host_peak, on_host)

    def _note_device(self, working: int, on_host: int | None = None) -> None:
        """The device's peak, with `working` bytes beyond the ledger (in `at_device_peak` as
        "working"); `on_host`: what the host tier holds now, where the caller has it."""
        ledger = self.ledger
        if on_host is None:
            on_host = self.on_host() if self.host_kinds else 0
        on_device = ledger.total - on_host + working
        if on_device <= self.device_peak:
            return
        self.device_peak = on_device
        if self.host_kinds:  # the device units' state is on the device, the rest on the host
            kept = self.device_state
            self.at_device_peak = {k: kept.get(k, 0) if k in self.host_kinds else b
                                   for k, b in ledger.bytes.items()}
        else:  # a CPU, where it is read most: the device holds it all
            self.at_device_peak = dict(ledger.bytes)
        if working:
            self.at_device_peak["working"] = working

    def on_host(self) -> int:
        """What the ledger holds now in the host tier: the host kinds less the device units'
        state (nothing on a device without a host tier)."""
        held, kept = self.ledger.bytes, self.device_state
        return sum(held[k] - kept.get(k, 0) for k in self.host_kinds)


class MemoryClock:
    """One simulated step's view of a StageMemory: it stamps each change of the bytes held with
    the time its action returns, on the stage's timeline."""

    __slots__ = ("changes", "memory", "next")

    def __init__(self, memory: StageMemory, timeline: RankTimeline):
        timeline.memory.append((0.0, memory.at_start))
        timeline.peak, timeline.at_peak = memory.peak, dict(memory.at_peak)
        timeline.device_peak, timeline.host_peak = memory.device_peak, memory.host_peak
        timeline.at_device_peak = dict(memory.at_device_peak)
        timeline.held_before_training = memory.held_before_training
        self.changes, self.memory, self.next = memory.changes, timeline.memory, 0

    def record(self, now: float) -> None:
        """The stage's next action returns at `now`."""
        total = self.changes[self.next]
        self.next += 1
        if total is not None:
            self.memory.append((now, total))
