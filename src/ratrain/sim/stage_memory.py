"""A simulated stage's memory: its ledger (schedule/ledger.py), holding from the start the state
a stage keeps from one step to the next, to which each action the stage runs applies the op
registry's memory effects, sized by the cost model's storages (as the executor's ledger applies
them to real tensors); and what of it lives in a host tier apart from the device. Each change
is noted on the stage's timeline: bytes over time, the peak by kind, the device and host
peaks."""

from __future__ import annotations

from ratrain.schedule.ir import Action
from ratrain.schedule.ledger import Ledger, apply_effects
from ratrain.schedule.ops import SPECS
from ratrain.sim.cost_model import StageCosts
from ratrain.sim.result import RankTimeline


class StageMemory:
    def __init__(self, costs: StageCosts, timeline: RankTimeline, resident_views: bool,
                 synchronous_copies: bool):
        """`resident_views`: the plan's views stay allocated between steps (view window 0);
        `synchronous_copies`: the device has no host link (a CPU: no host tier apart)."""
        self.costs, self.timeline = costs, timeline
        # What lives in the host tier, where it is not the device's own memory (a GPU's host).
        self.host_kinds = (set() if synchronous_copies else
                           {"offloaded"} | ({"masters", "gradients", "optimizer"}
                                            if costs.s.state_home == "host" else set()))
        self.ledger = Ledger()
        # the state of the units kept on the device: held for the run, in the host kinds
        self.device_state = 0
        for owner, kind, key, nbytes in costs.state_owners():
            self.ledger.hold_storage(owner, kind, key, nbytes)
            if kind in self.host_kinds and owner[1] in costs.s.device_units:
                self.device_state += nbytes
        if resident_views:
            for u in costs.s.view_units:
                self.ledger.hold_storage(("views", u), "views", ("view", u), costs.view_bytes(u))
        self.ledger.reset_peak()
        self.note(0.0)
        at_start = self.ledger.bytes
        timeline.held_before_training = at_start["masters"] + at_start["gradients"]

    def record(self, a: Action, now: float) -> None:
        """Apply action `a`'s memory effects at time `now`."""
        before = self.ledger.total
        costs = self.costs
        apply_effects(self.ledger, SPECS[a.op].memory, a.unit, a.mb,
                      lambda name: costs.storages(name, a))
        if self.ledger.total != before:
            self.note(now)

    def note(self, now: float) -> None:
        ledger, timeline = self.ledger, self.timeline
        timeline.memory.append((now, ledger.total))
        timeline.peak, timeline.at_peak = ledger.peak, dict(ledger.at_peak)
        on_host = sum(ledger.bytes[k] for k in self.host_kinds) - self.device_state
        timeline.device_peak = max(timeline.device_peak, ledger.total - on_host)
        timeline.host_peak = max(timeline.host_peak, on_host)
