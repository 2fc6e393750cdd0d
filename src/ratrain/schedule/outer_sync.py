"""Low-communication training (`--sync diloco:H[:F][:bf16][:islands=K]`, plan field `sync`):
DiLoCo and Streaming DiLoCo for the data-parallel replicas of a pipeline, as lifecycle actions.

With it the replicas do not sum gradients every step (the inner programs have no GS): each
replica, a whole pipeline, takes H inner steps with its own AdamW. Then per unit, `OS u` takes
the outer delta (the unit's outer parameters minus this replica's local ones) and starts its
all-reduce over the replicas; `WOS u` waits for it, takes the outer Nesterov SGD step on the
outer parameters with the mean delta as the gradient (DiLoCo: lr 0.7, momentum 0.9) and merges
the result into the local parameters. The outer parameters and momentum are unit state in the
home tier, identical on every replica.

Two forms, by whether a fragment count is given:

* `diloco:H` (DiLoCo): every unit syncs after inner steps H, 2H, ...: in the program of that
  step, `OS u` right after `U u` (the all-reduce runs under the later units' updates and, on
  the later stages, under stage 0's cool-down) and every `WOS u` right before `E`. Nothing
  changes the local parameters between the two, so the replicas continue from the outer
  result exactly: local := outer.
* `diloco:H:F` (Streaming DiLoCo): the units are cut into F fragments of consecutive units;
  fragment f's delta is taken after inner steps off_f + kH (off_f = f H / F, k >= 1), so the
  fragments sync in turn, spread over the H steps, and no more than one fragment's bytes cross
  the link in a step. Its all-reduce overlaps the whole next step: `OS u` at the start of that
  step's program, `WOS u` right after the step's `U u`. The outer result therefore arrives one
  inner step late, and is mixed into the local parameters that moved on meanwhile:
  local := mix * local + (1 - mix) * outer (Streaming DiLoCo's merge; --outer-mix, 0.5).

`:bf16` sends the deltas in bfloat16 (half the bytes); the outer step is fp32.

`:islands=K` (hierarchical DiLoCo, for sites of several devices joined by a slow link): the dp
replicas form K islands of dp / K neighbouring replicas, each a synchronous data-parallel group
(its gradients summed every step, GS/WGS over the island, as `--sync step` does over all), and
the islands are DiLoCo's workers. The replicas of an island hold the same local state, so each
carries 1/(dp/K) of a unit's delta to the other islands (the all-reduce across them) and the
island all-gathers the sums: one delta per island crosses the slow link, not dp / K. With
--shard-state each island's state (and its outer state) is sharded over its replicas: each
replica's delta is its shard's, summed across the islands, with nothing to gather. Without
islands every replica is an island of its own.

A run's last step syncs every unit whose local steps the outer parameters do not hold yet
(where H does not divide --steps, or under streaming, always): else the model a run ends with
(its outer parameters: what validation reads, `export` writes and a resume continues from)
would leave out up to H - 1 steps, and all of them where H > --steps. That final sync runs each
unit's `OS u` and `WOS u` right after its `U u`, one unit's delta held at a time (no more
memory than any synced step), since nothing is left to overlap it with.

Programs may differ per step: `step_programs(plan, step, steps)` adds the outer sync of the
units due at `step` (of a run of `steps`) to the plan's inner programs. Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ratrain.schedule.errors import ScheduleConfigError
from ratrain.schedule.ir import Action, Program
from ratrain.schedule.ops import Op
from ratrain.schedule.passes import insert_at

EVERY_STEP = "step"
"""The synchronous default: every gradient summed over the replicas every step."""
DELTA_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class OuterSync:
    every: int  # H: inner steps between a unit's outer syncs
    fragments: int | None = None  # F: streaming, overlapped; None: DiLoCo, every unit at once
    delta_dtype: str = "float32"  # what the deltas cross the link in
    islands: int | None = None  # K: synchronous groups of dp / K replicas; None: every replica one

    def island_size(self, dp: int) -> int:
        """Replicas per island: those whose gradients are summed every step."""
        return dp // self.islands if self.islands else 1

    def workers(self, dp: int) -> int:
        """The inner loops that step apart and average their deltas: the islands."""
        return self.islands or dp

    @property
    def streaming(self) -> bool:
        return self.fragments is not None

    @property
    def delta_bytes(self) -> int:
        """Bytes per parameter of an outer delta on the link."""
        return 2 if self.delta_dtype == "bfloat16" else 4

    def fragment_of(self, unit: int, n_units: int) -> int:
        """Units cut into F runs of consecutive units, as even as whole units allow."""
        return unit * (self.fragments or 1) // n_units

    def offset(self, fragment: int) -> int:
        return fragment * self.every // (self.fragments or 1)

    def fragment_due(self, step: int) -> int | None:
        """The fragment whose outer sync runs in the program of `step` (0-based), or None.
        DiLoCo: fragment 0 (all units) after inner steps H, 2H, ... (step + 1 = kH). Streaming:
        fragment f's delta is taken after inner step off_f + kH (k >= 1) and synced in the
        next step's program, so at step = off_f + kH; offsets are distinct (F <= H)."""
        if not self.streaming:
            return 0 if (step + 1) % self.every == 0 else None
        for f in range(self.fragments):
            if step >= self.every and (step - self.offset(f)) % self.every == 0:
                return f
        return None

    def first_synced_after(self, fragment: int) -> int:
        """The inner steps after which fragment `fragment`'s outer parameters first change
        (a checkpoint at that step or later holds an outer sync of it): H under DiLoCo;
        streaming syncs a fragment in the step after its delta is taken, so one more."""
        return self.offset(fragment) + self.every + (1 if self.streaming else 0)

    def final_sync_due(self, step: int, steps: int | None) -> bool:
        """Whether `step` (0-based) is the last of a run of `steps` and ends it with local steps
        the outer parameters do not hold: not a DiLoCo sync step (kH), or under streaming,
        where each fragment's delta is taken a step before its sync."""
        if steps is None or step + 1 != steps:
            return False
        return self.streaming or self.fragment_due(step) is None

    def synced_steps(self) -> list[int]:
        """The steps of a steady period (the second: streaming's fragments first sync there)
        whose programs hold an outer sync, one a fragment."""
        # by formula, not by asking fragment_due of each of H steps: H is the user's number
        # (diloco:1000000000 hung train, simulate and plan at their start)
        if not self.streaming:
            return [2 * self.every - 1]
        return sorted(self.every + self.offset(f) for f in range(self.fragments))


def parse_sync(text: str) -> OuterSync | None:
    """`step` (None) or `diloco:H[:F][:bf16][:islands=K]`; ScheduleConfigError (a user error)
    otherwise."""
    if text == EVERY_STEP:
        return None
    parts = text.split(":")
    usage = f"--sync takes {EVERY_STEP} or diloco:H[:F][:bf16][:islands=K], got {text!r}"
    islands, dtype = None, "float32"
    for option in [p for p in parts[2:] if not p.isdigit()]:  # after H, in any order
        if option.startswith("islands=") and islands is None:
            count = option[len("islands="):]
            if not count.isdigit() or int(count) < 2:
                raise ScheduleConfigError(f"--sync ...:islands=K needs a whole number K >= 2 of "
                                          f"synchronous groups of replicas, got {text!r}")
            islands = int(count)
        elif option == "bf16" and dtype == "float32":
            dtype = "bfloat16"
        else:
            raise ScheduleConfigError(usage)
        parts.remove(option)
    if parts[0] != "diloco" or len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
        raise ScheduleConfigError(usage)
    every = int(parts[1])
    fragments = int(parts[2]) if len(parts) == 3 else None
    if every < 1:
        raise ScheduleConfigError(f"--sync diloco:H needs H >= 1 inner steps between outer "
                                  f"syncs, got H={every}")
    if fragments is not None and not 1 <= fragments <= every:
        raise ScheduleConfigError(f"--sync diloco:H:F needs 1 <= F <= H (each fragment syncs "
                                  f"at its own step of the H), got F={fragments}, H={every}")
    return OuterSync(every, fragments, dtype, islands)


def grad_sync_replicas(sync: str, dp: int) -> int:
    """The replicas a step's gradients are summed over: all dp (synchronous), an island's
    (`islands=K`), or 1 (DiLoCo: every replica alone)."""
    outer = parse_sync(sync)
    return dp if outer is None else outer.island_size(dp)


def outer_refusal(sync: str, dp: int, policy: str, shard_state: bool,
                  n_units: int, shard_group: int | None = None) -> str | None:
    """Why this outer sync cannot run with this layout (one line), or None. With islands,
    sharded state is sharded over each island's replicas, which hold one state between them
    (not over the stage's: the islands' states differ); a --shard-group would sum the shards
    across the islands every step."""
    outer = parse_sync(sync)
    if outer is None:
        return None
    if dp < 2:
        return f"--sync {sync} averages replicas' deltas: it needs --dp >= 2, got dp={dp}"
    if outer.islands and dp % outer.islands:
        return _unequal_islands(sync, dp, outer.islands)
    if policy != "ratrain":
        return f"--sync {sync} needs --policy ratrain (the baseline policy syncs every step)"
    if shard_state and outer.islands and outer.island_size(dp) < 2:
        return (f"--sync {sync} at --dp {dp} makes islands of one replica, which --shard-state "
                f"has none to shard over: it needs 2 or more replicas an island (more --dp, or "
                f"fewer islands)")
    if shard_state and outer.island_size(dp) < 2:
        return (f"--sync {sync} keeps each replica's whole local state, which --shard-state "
                f"slices over the replicas; drop one of them, or shard each island's state "
                f"over its replicas with :islands=K (2 or more replicas an island)")
    if shard_group is not None:
        return (f"--shard-group {shard_group} sums each shard across the groups every step, "
                f"which --sync {sync} does not; with :islands=K, --shard-state shards each "
                f"island's state over its replicas")
    if (outer.fragments or 1) > n_units:
        return (f"--sync {sync}: {outer.fragments} fragments for a model of {n_units} units; "
                f"use at most {n_units}")
    return None


def _unequal_islands(sync: str, dp: int, islands: int) -> str:
    """Why K islands that do not divide dp are refused: an island's replicas each carry one of
    dp / K slices of its delta to the same replica of every other island
    (runtime/outer_sync.py), and the outer step weighs the islands alike, which is the mean
    over the replicas' batches only where every island has as many."""
    fits = ", ".join(str(k) for k in range(2, dp + 1) if dp % k == 0)
    return (f"--sync {sync}: {islands} islands do not divide --dp {dp} replicas into islands of "
            f"equal size (each carries its delta in dp / K slices, one a replica); use "
            f"islands=K with K one of {fits}, or a --dp that is a multiple of {islands}")


def check_outer(sync: str, dp: int, policy: str, shard_state: bool, n_units: int,
                shard_group: int | None = None) -> None:
    reason = outer_refusal(sync, dp, policy, shard_state, n_units, shard_group)
    if reason:
        raise ScheduleConfigError(reason)


def add_outer_sync(programs: list[Program], units: frozenset[int],
                   streaming: bool) -> list[Program]:
    """The outer sync of `units` added to a step's programs (see the module docstring for where
    each goes and why). Every unit in `units` has its `U u` in its stage's program."""
    out = []
    for program in programs:
        updates = {a.unit: i for i, a in enumerate(program) if a.op is Op.UPDATE and a.unit in units}
        due = sorted(updates, key=updates.__getitem__)  # the order the updates run in
        at: dict[int, list[Action]] = {}
        if streaming:
            at[0] = [Action(Op.OUTER_SYNC, u) for u in due]
            for u in due:
                at.setdefault(updates[u] + 1, []).append(Action(Op.WAIT_OUTER_SYNC, u))
        else:
            for u in due:
                at.setdefault(updates[u] + 1, []).append(Action(Op.OUTER_SYNC, u))
            end = next(i for i, a in enumerate(program) if a.op is Op.STEP_END)
            at.setdefault(end, []).extend(Action(Op.WAIT_OUTER_SYNC, u) for u in due)
        out.append(insert_at(program, at))
    return out


def due_units(outer: OuterSync, stage_units: list[range], step: int) -> frozenset[int]:
    """The units whose outer sync runs in the program of `step`."""
    fragment = outer.fragment_due(step)
    if fragment is None:
        return frozenset()
    n_units = stage_units[-1].stop
    return frozenset(u for units in stage_units for u in units
                     if outer.fragment_of(u, n_units) == fragment)


def add_final_sync(programs: list[Program], units: frozenset[int]) -> list[Program]:
    """A run's last step's outer sync of `units`: each unit's `OS u` and `WOS u` right after its
    `U u` (see the module docstring)."""
    out = []
    for program in programs:
        at = {i + 1: [Action(Op.OUTER_SYNC, a.unit), Action(Op.WAIT_OUTER_SYNC, a.unit)]
              for i, a in enumerate(program) if a.op is Op.UPDATE and a.unit in units}
        out.append(insert_at(program, at))
    return out


def step_programs(plan, step: int, steps: int | None = None) -> list[Program]:
    """The programs of a plan (schedule/plan.PipelinePlan) at `step` of a run of `steps` (None:
    a step that is not the last): its inner programs, with the outer sync of the units due at
    that step, or the run's final sync of them all."""
    outer = parse_sync(plan.sync)
    if outer is None:
        return plan.programs
    if outer.final_sync_due(step, steps):
        return _final(tuple(map(tuple, plan.programs)), _all_units(plan))
    units = due_units(outer, plan.stage_units, step)
    return _with_outer(tuple(map(tuple, plan.programs)), units, outer.streaming) if units else plan.programs


def _all_units(plan) -> frozenset[int]:
    return frozenset(u for units in plan.stage_units for u in units)


@lru_cache(maxsize=64)
def _with_outer(programs: tuple, units: frozenset[int], streaming: bool) -> list[Program]:
    # at most F + 1 distinct programs in a run: made once each
    return add_outer_sync([list(p) for p in programs], units, streaming)


@lru_cache(maxsize=8)
def _final(programs: tuple, units: frozenset[int]) -> list[Program]:
    return add_final_sync([list(p) for p in programs], units)


def every_variant(plan) -> list[list[Program]]:
    """Each distinct set of a plan's step programs (for the checks): one per fragment, and the
    last step's final sync."""
    outer = parse_sync(plan.sync)
    if outer is None:
        return []
    n_units = plan.stage_units[-1].stop
    return [*(add_outer_sync(plan.programs, frozenset(
        u for units in plan.stage_units for u in units if outer.fragment_of(u, n_units) == f),
        outer.streaming) for f in range(outer.fragments or 1)),
        add_final_sync(plan.programs, _all_units(plan))]
