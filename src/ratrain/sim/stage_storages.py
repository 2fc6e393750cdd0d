"""The named storages of a stage's program's memory effects, in bytes (StageStorages, one half
of sim/stage_costs.StageCosts): the executor's ledger calls, sized from the stage's setup, so
the simulator's memory walk is the executor's ledger by construction."""

from __future__ import annotations

from ratrain.schedule.ir import Action, Op
from ratrain.schedule.unit_major import HOLD
from ratrain.sim import unit_costs as uc
from ratrain.sim.outer_sync import delta_bytes, outer_state_owners
from ratrain.sim.working_bytes import working_bytes

_PHASES = {Op.RECOMPUTE: "saving", Op.BACKWARD: "backward", Op.BACKWARD_INPUT: "backward_input",
           Op.BACKWARD_WEIGHT: "weight"}


class StageStorages:
    """Sizes of what a stage holds and moves; StageCosts supplies `s` (its StageSetup),
    `act_bytes`, `view_bytes`, `runs_on_device`, `device_summed` and `_working` (a dict)."""


    def state_owners(self) -> list[tuple[tuple, str, tuple, int]]:
        """What a stage holds from one step to the next: each unit's unit_state_owners, and
        the host update's fp32 scratch where some unit's gradient is bf16."""
        scratch = self.s.update_scratch
        return [owner for u in self.s.units for owner in self.unit_state_owners(u)] + (
            [(("gradients", "update scratch"), "gradients", ("update_scratch",), scratch)]
            if scratch else [])

    def unit_state_owners(self, u: int) -> list[tuple[tuple, str, tuple, int]]:
        """A unit's masters, fp32 gradients and AdamW state (from the first update on).
        Sharded: the slice's masters, the full accumulation buffer plus the shard's gradient,
        AdamW over the slice's pieces (one 1-D parameter per tensor it intersects); with a
        gradient lifetime shorter than the step, no full buffer (`grad_full` is the
        backward's), and for "micro-batch" the reduction's slice-sized output."""
        shard = self.s.shard(u)
        if shard:
            full = {"step": shard.padded, "transient": 0, "micro-batch": shard.size}
            masters, gradients = 4 * shard.size, 4 * (full[self.s.grad_lifetime] + shard.size)
            optimizer = 8 * shard.real + 4 * shard.pieces
        else:
            n = self.s.params(u)
            masters, gradients = 4 * n, self.s.grad_bytes(u) * n
            optimizer = 8 * n + 4 * uc.param_tensors(self.s.model, self.s.kind(u))
        return [(("masters", u), "masters", ("master", u), masters),
                (("gradients", u), "gradients", ("gradbuf", u), gradients),
                (("optimizer", u), "optimizer", ("optim", u), optimizer)] + outer_state_owners(self, u)

    def storages(self, name: str, a: Action) -> list[tuple[tuple, int]]:
        """A storage name of the op registry's memory effects (schedule/ops.py), for action
        `a`, as (storage key, bytes): what the executor binds to real tensors."""
        u, mb = a.unit, a.mb
        # the most read first: a plan's simulation reads thousands
        if name == "input":
            return [self.input_storage(u, mb)]
        if name == "output":
            (_, *at), nbytes = self.output_storage(u, mb)
            # R's output is a new tensor: where the forward's is still the next unit's input
            # (a split backward frees that unit's activations only at its BW), both are held.
            return [(("recomputed" if a.op is Op.RECOMPUTE else "out", *at), nbytes)]
        if name == "grad_full":
            shard = self.s.shard(u)
            live = shard and self.s.grad_lifetime != "step" and self.s.params(u)
            return [(("gradfull", u), 4 * shard.padded)] if live else []
        if name == "kept":
            return [] if self.s.activation.get(u, "keep") == "recompute" else self.saved_storages(u, mb)
        if name == "grad_run":
            held_in_run = (self.runs_on_device(u)
                           and (self.s.fold_roles or {}).get((u, mb)) == HOLD)
            held = u in self.s.view_units and (u in self.device_summed or held_in_run)
            return [(("rungrad", u), 4 * self.s.params(u))] if held else []
        if name == "input_grad":
            return [(("grad", u - 1, mb), self.act_bytes())] if u > 0 else []
        if name == "saved":
            return self.saved_storages(u, mb)
        if name == "outer_delta":
            return [(("outer_delta", u), delta_bytes(self, u))]
        if name == "saved_host":
            return self.saved_storages(u, mb, "host")
        if name == "saved_reloaded":
            return self.saved_storages(u, mb, "reloaded")
        if name == "wgrad_saved":
            if self.s.kind(u) == "embedding":  # all it saved: BW is its whole backward
                return self.saved_storages(u, mb, self._saved_tag(u))
            return [((self._saved_tag(u), u, mb, "wgrad"),
                     uc.wgrad_saved_bytes(self.s.shape, self.s.kind(u)))]
        if name == "received":
            return [(("out", u, mb), self.act_bytes())]
        if name == "output_grad":
            return [(("grad", u, mb), self.act_bytes())]
        if name == "wgrad_seeds":  # the output gradient (not the head's: a loss), and the rest
            out = [] if self.s.kind(u) == "head" else [(("grad", u, mb), self.act_bytes())]
            if u == 0:  # its BW is its whole backward: from its output
                out.append(self.output_storage(u, mb))
            return out + [(("seed", u, mb, i), n)
                          for i, n in enumerate(uc.wgrad_seed_bytes(self.s.shape, self.s.kind(u)))]
        if name == "view":
            return [(("view", u), self.view_bytes(u))]
        raise KeyError(f"no size for storage {name!r} of {a}")

    def working(self, a: Action) -> int:
        """What a compute action allocates while it runs beyond what the ledger holds before
        it (sim/working_bytes.py); 0 for the rest. A forward saves under keep and offload."""
        if a.op is Op.FORWARD:
            phase = "forward" if self.s.activation.get(a.unit, "keep") == "recompute" else "saving"
        else:
            phase = _PHASES.get(a.op)
            if phase is None:
                return 0
        key = (self.s.kind(a.unit), phase)
        if key not in self._working:
            self._working[key] = working_bytes(self.s.shape, *key)
        return self._working[key]

    def tokens_bytes(self) -> int:
        """The loader gives a step's micro-batches as views of one int64 tensor."""
        return self.s.n_micro * self.s.shape.tokens * 8

    def input_storage(self, u: int, mb: int) -> tuple[tuple, int]:
        if u == 0:
            return ("tokens",), self.tokens_bytes()
        return ("out", u - 1, mb), self._act_bytes

    def output_storage(self, u: int, mb: int) -> tuple[tuple, int]:
        return ("out", u, mb), uc.output_bytes(self.s.shape, self.s.kind(u))

    def _saved_tag(self, u: int) -> str:
        """Where unit u's saved activations are when its backward runs."""
        return "reloaded" if self.s.activation.get(u, "keep") == "offload" else "saved"

    def saved_storages(self, u: int, mb: int, tag: str = "saved") -> list[tuple[tuple, int]]:
        """What unit u's forward on mb saves, as storages. The cached rotary tables and the
        targets are shared by every micro-batch on the device; a copy to the host or back
        (tag "host", "reloaded") is each micro-batch's own."""
        shape, kind = self.s.shape, self.s.kind(u)
        shared = tag == "saved"
        out = [((tag, u, mb), uc.saved_bytes(shape, kind))]
        if uc.table_bytes(shape, kind):
            out.append((("rope",) if shared else (tag, u, mb, "rope"), uc.table_bytes(shape, kind)))
        if kind == "head":  # views of the step's one int64 tensor of targets, like the inputs
            out.append((("targets",) if shared else (tag, u, mb, "targets"), self.tokens_bytes()))
        return out
