"""What a resume takes from a checkpoint saved with other settings: whose state each replica
starts from, and what it says about the run's course changing.

A synchronous checkpoint holds one state, which every replica takes. A --sync diloco checkpoint
holds each worker's (replica's, or island's) own local weights and AdamW state, and the outer
parameters: the model of the last outer sync. Resumed with the same workers (--dp and islands),
each takes its own. Resumed with others (another --dp or islands, or `--sync step`), the saved
workers do not map onto the new ones: until 2026-11-29 a replica took the state of the saved
worker of its index, or worker 0's where there was none, so a synchronous resume went on with
replicas on different weights, and a larger --dp counted worker 0 twice in every average. Now
every replica starts from the outer parameters, with worker 0's AdamW state, and the run says so.
Another H, fragment count or delta dtype on the same workers is allowed too (each replica goes
on from its own state) and said: until 2026-12-02 it was silent.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ratrain.checkpoint.store import outer_weights
from ratrain.config import ParallelConfig, RunConfig
from ratrain.runtime.optim import lr_at
from ratrain.schedule.outer_sync import EVERY_STEP, grad_sync_replicas, parse_sync


@dataclass(frozen=True)
class ResumedState:
    """Whose files a replica reads (checkpoint/store.py's replica), and whether its weights are
    the outer parameters instead of that worker's local ones."""

    files: int
    from_outer: bool = False


def resumed_state(saved: dict, now: ParallelConfig, replica: int) -> ResumedState:
    """`saved`: the checkpoint's config's parallel section; `now`: the resuming run's."""
    sync = saved.get("sync", EVERY_STEP)
    if sync == EVERY_STEP:
        return ResumedState(0)
    if now.diloco and _workers(sync, saved["dp"]) == _workers(now.sync, now.dp):
        return ResumedState(now.files_of(replica))
    return ResumedState(0, from_outer=True)


def _workers(sync: str, dp: int) -> tuple[int, int]:
    """How a DiLoCo layout maps replicas to saved states: dp, and replicas an island."""
    return dp, grad_sync_replicas(sync, dp)


def relayout_note(saved: dict, now: ParallelConfig) -> str | None:
    """What a resume onto other workers does, for stderr (None: each takes its own)."""
    if not resumed_state(saved, now, 0).from_outer:
        return None
    return (f"the checkpoint was saved by --sync {saved['sync']} at --dp {saved['dp']}, whose "
            f"replicas' local states do not map onto this run's (--sync {now.sync} at --dp "
            f"{now.dp}): every replica starts from its outer parameters (the model of its last "
            f"outer sync; local steps after it, if any, are left out) with replica 0's optimizer state")


def sync_change_note(saved: dict, now: ParallelConfig) -> str | None:
    """What a resume under another --sync does, for stderr (None: the same sync). A change is
    allowed (the outer step's flags are free on resume to retune it, resume_settings.py), and
    said: one onto other workers is relayout_note's; one of H, fragments or the deltas' dtype
    keeps each replica's own state, and the outer syncs follow the new form from here."""
    note = relayout_note(saved, now)
    was = saved.get("sync", EVERY_STEP)
    if note or parse_sync(was) == parse_sync(now.sync):
        return note
    if was == EVERY_STEP:
        return (f"--sync {was} -> {now.sync}: the checkpoint is of a synchronous run; the outer "
                "parameters start at its weights, with no momentum")
    return (f"--sync {was} -> {now.sync}: a change of the run's outer sync, allowed on resume: "
            f"each replica goes on from its own state, and syncs as {now.sync} does from the "
            "first resumed step on")


class OuterAsWeights(Mapping):
    """Unit states (checkpoint.UnitStates) with each unit's outer parameters as its weights."""

    def __init__(self, states: Mapping[int, dict], cfg: RunConfig):
        from ratrain.models.llama import build_units

        self.states = states
        with torch.device("meta"):  # the parameters' names and shapes only
            self.modules = build_units(cfg.model, cfg.train.seed)

    def __getitem__(self, unit: int) -> dict:
        state = self.states[unit]
        return {**state, "weights": outer_weights(self.modules[unit], state)}

    def __iter__(self):
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)


def say_what_changed(meta: dict, cfg: RunConfig, loader: dict) -> None:
    """What a resume changes in the run's course, on stderr: another --sync (sync_change_note),
    other training data (`loader`: the loader's state_dict() now; other sequences from here),
    or another --steps (the cosine stretched or compressed: the learning rate jumps at the
    resumed step)."""
    step = meta["step"]  # steps done: the first resumed one is step + 1, run at lr_at(step)
    note = sync_change_note(meta["config"]["parallel"], cfg.parallel)
    if note:
        print(note, file=sys.stderr, flush=True)
    before, now = meta["loader"].get("tokens"), loader["tokens"]
    # a checkpoint of before 2026-12-02 has no fingerprint: the count alone tells
    changed = (meta["loader"]["fingerprint"] != loader.get("fingerprint")
               if "fingerprint" in meta["loader"] else before is not None and before != now)
    if changed:
        # the data path, tokenizer and val_fraction cannot change on resume: what is there can
        count = (f"{before:,} tokens, now {now:,}" if before != now
                 else f"{now:,} tokens as before, but other ones")
        print(f"the training data changed since the checkpoint ({count}: "
              f"{cfg.data.path or 'the standard library'} holds other data than it did): the "
              f"sequences are drawn anew from step {step + 1:,} on, not as the run would have",
              file=sys.stderr, flush=True)
    saved = dataclasses.replace(cfg.train, steps=meta["config"]["train"]["steps"])
    was, will = lr_at(step, saved), lr_at(step, cfg.train)
    if saved.steps != cfg.train.steps and abs(will - was) > 0.01 * max(was, will):
        how = "stretched" if cfg.train.steps > saved.steps else "compressed"
        print(f"--steps {saved.steps:,} -> {cfg.train.steps:,}: the cosine schedule is {how} "
              f"over the new length, so the learning rate of step {step + 1:,} (the first "
              f"resumed) goes {was:.3g} -> {will:.3g}"
              + (f" (step {step:,} ran at {lr_at(step - 1, saved):.3g})" if step else ""),
              file=sys.stderr, flush=True)
