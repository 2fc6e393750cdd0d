"""Low-communication training's outer sync (--sync diloco; the algorithm and where its actions
go: schedule/outer_sync.py): each unit's outer parameters and Nesterov momentum, and the
handlers of `OS u` (the outer delta, its all-reduce started) and `WOS u` (the wait, the outer
step, the merge into the local parameters).

The outer state is one flat fp32 buffer per unit for the parameters and one for the momentum,
the unit's parameters in order, in the state's home tier (where its masters are), counted by
the ledger as optimizer state: the outer optimizer's. The local parameters are the unit's fp32
masters, which the inner AdamW updates.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from ratrain.config import TrainConfig
from ratrain.runtime.sharded_layout import Sharded
from ratrain.runtime.step_state import StepState
from ratrain.runtime.unit_state import UnitState
from ratrain.schedule.ir import Action
from ratrain.schedule.ops import Op
from ratrain.schedule.outer_sync import OuterSync

DELTA_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class OuterUnit:
    """One unit's outer parameters (a copy of its masters when the run starts) and momentum;
    of sharded state (within an island), of this replica's slice of the unit, whose delta is
    summed across the islands whole and whose checkpoint is gathered over the island."""

    def __init__(self, state: UnitState):
        self.state = state
        self.sharded = state.layout if isinstance(state.layout, Sharded) else None
        start = self.fresh()
        self.params, self.momentum = start["params"], start["momentum"]
        state.ledger.hold(("outer", state), "optimizer", [self.params, self.momentum])

    def _pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The local parameters this replica holds and the outer parameters' regions that match
        them: the masters, or sharded, the master slice (its padding zero, as the outer's)."""
        if self.sharded:
            return [self.sharded.master], [self.params]
        return self.state.masters, self.state.param_slices(self.params)

    def _local(self) -> torch.Tensor:
        """The local parameters, flat (a copy)."""
        local = [self.sharded.master] if self.sharded else self.state.masters
        return torch.cat([m.detach().reshape(-1) for m in local])

    def delta(self, dtype: torch.dtype) -> torch.Tensor:
        """Outer parameters minus this replica's local ones, in the dtype they travel in."""
        return (self.params - self._local()).to(dtype)

    @torch.no_grad()
    def step(self, summed: torch.Tensor, replicas: int, cfg: TrainConfig, mix: float | None) -> None:
        """The outer Nesterov SGD step (torch.optim.SGD's, nesterov=True, dampening 0) with the
        mean of the `replicas`' (the islands') deltas as the gradient, then the merge: local :=
        outer (mix None), or local := mix * local + (1 - mix) * outer (a result that arrived
        late)."""
        grad = summed.float() / replicas
        mu = cfg.outer_momentum
        self.momentum.mul_(mu).add_(grad)
        self.params.sub_(grad.add(self.momentum, alpha=mu), alpha=cfg.outer_lr)
        for m, outer in zip(*self._pairs()):
            if mix is None:
                m.copy_(outer)
            else:
                m.mul_(mix).add_(outer, alpha=1 - mix)

    def trade(self) -> None:
        """The local and the outer parameters swap places (through one unit's copy)."""
        local = self._local()
        for m, outer in zip(*self._pairs()):
            m.copy_(outer)
        self.params.copy_(local)

    def fresh(self) -> dict:
        """The outer state of a run that starts here (from a checkpoint of a synchronous run,
        which has none): the masters as they are, no momentum."""
        with torch.no_grad():
            params = self._local().float().clone()
        return {"params": params, "momentum": torch.zeros_like(params)}

    def state_dict(self) -> dict:
        """The whole unit's (sharded: gathered over the island, which every replica joins)."""
        params, momentum = self.params.detach(), self.momentum.detach()
        if self.sharded:
            params, momentum = (self.sharded.whole(self.state, t) for t in (params, momentum))
        return {"params": params.cpu().clone(), "momentum": momentum.cpu().clone()}

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        """A whole unit's outer state (state_dict's; sharded: this replica's slice of it)."""
        for mine, whole in ((self.params, sd["params"]), (self.momentum, sd["momentum"])):
            whole = whole.to(mine.device)
            mine.copy_(self.sharded.slice_of(whole) if self.sharded else whole)


class OuterStates:
    """The stage's units' outer state and the settings of the outer step."""

    def __init__(self, states: dict[int, UnitState], sync: OuterSync, cfg: TrainConfig):
        self.sync, self.cfg = sync, cfg
        self.units = {u: OuterUnit(s) for u, s in states.items()
                      if s.masters or isinstance(s.layout, Sharded)}  # (a slice of padding)
        self.delta_dtype = DELTA_DTYPES[sync.delta_dtype]
        self.mix = cfg.outer_mix if sync.streaming else None

    @contextmanager
    def outer_weights(self):
        """The outer parameters in the masters' place while the block runs (validation: the
        model the run exports and every replica continues from at the next sync, the same on
        every replica), this replica's local ones back after it, bit for bit. The two trade
        places unit by unit through one unit's copy, not a copy of the stage's weights."""
        self._trade()
        try:
            yield
        finally:
            self._trade()

    @torch.no_grad()
    def _trade(self) -> None:
        for unit in self.units.values():
            unit.trade()


def start(ex, st: StepState, a: Action):
    """OS u: the unit's outer delta, summed over the stage's replicas in place (a delta in
    host memory over the stage's gloo group, Groups.outer_group). With islands, each replica of
    an island sums only its slice of it across the islands (the island's replicas hold the
    same delta): one delta crosses per island. Sharded state's delta is its shard's already:
    summed across the islands whole."""
    unit = ex.outer.units[a.unit]
    delta = unit.delta(ex.outer.delta_dtype)
    size = 1 if unit.sharded else ex.groups.island_size  # a shard's delta crosses whole
    if size > 1:
        part = -(-delta.numel() // size)
        delta = torch.nn.functional.pad(delta, (0, part * size - delta.numel()))
    group = ex.groups.outer_group(delta)
    mine = _slice(delta, ex.groups) if size > 1 else delta
    work = dist.all_reduce(mine, group=group, async_op=True)
    st.pending[a] = (work, delta, group is ex.groups.host_replicas)
    st.bind(outer_delta=[delta])
    return work


def wait(ex, st: StepState, a: Action) -> None:
    """WOS u: the sum waited for under the comm's deadline (with islands, then the island's
    slices of it gathered), then the outer step and merge."""
    work, summed, on_host = st.pending.pop(Action(Op.OUTER_SYNC, a.unit))
    (ex.comm.wait_host if on_host else ex.comm.wait)(work, st.when, str(a),
                                                     ex.comm.replica_peers())
    unit = ex.outer.units[a.unit]
    if ex.groups.island_size > 1 and not unit.sharded:
        group = ex.groups.island_group(summed)
        gathered = dist.all_gather(list(summed.chunk(ex.groups.island_size)),
                                   _slice(summed, ex.groups).clone(), group=group, async_op=True)
        (ex.comm.wait_host if on_host else ex.comm.wait)(gathered, st.when, str(a),
                                                         ex.comm.replica_peers())
        summed = summed[:unit.params.numel()]
    unit.step(summed, ex.outer.sync.workers(ex.dp), ex.outer.cfg, ex.outer.mix)


def _slice(delta: torch.Tensor, groups) -> torch.Tensor:
    """This replica's slice of a padded delta: its place in its island's."""
    part = delta.numel() // groups.island_size
    at = groups.replica % groups.island_size
    return delta[at * part:(at + 1) * part]
