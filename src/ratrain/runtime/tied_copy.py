"""Checkpoints of a head that keeps its own copy of a tied embedding (tied embeddings across
pipeline stages: schedule/tied_sync.py).

A checkpoint holds whole units in a form that does not depend on the pipeline layout, so a
run resumes under any --pp. For a tied model that form is the one-stage model's: the weight
once, under the embedding, with its AdamW state; the head without it. The head's stage saves
its unit without the copy (`shared_head`) and, resuming, makes the copy from the embedding's
files (`split_head`): both copies are equal, gradients, AdamW state and --sync diloco's outer
state included, at every step's end.
"""

from __future__ import annotations

import torch

COPY_NAME = "lm_head.weight"  # the head's copy, in its unit's state dict
EMBEDDING_NAME = "embed_tokens.weight"  # the tied weight, in the embedding's


def _place(optimizer: torch.optim.Optimizer, copy: torch.Tensor) -> tuple[int, int]:
    """(the copy's index, the parameter count) in the numbering of the optimizer's state_dict
    (its groups' parameters in turn)."""
    ids = [id(p) for group in optimizer.param_groups for p in group["params"]]
    return ids.index(id(copy)), len(ids)


def _outer_region(unit) -> slice:
    """The copy's elements in the head's flat buffers (the outer state's)."""
    return slice(unit.offsets[unit.tied], unit.offsets[unit.tied] + unit.sizes[unit.tied])


def shared_head(state: dict, unit) -> dict:
    """The head's unit state ({"weights", "optim"}, and "outer" under --sync diloco) without
    the copy, as a head that reads the embedding's weight has it; `unit` its UnitState."""
    out = {**state, "weights": {k: v for k, v in state["weights"].items() if k != COPY_NAME}}
    if "outer" in state:
        cut = _outer_region(unit)
        out["outer"] = {k: torch.cat([v[:cut.start], v[cut.stop:]])
                        for k, v in state["outer"].items()}
    sd, optimizer = state["optim"], unit.optimizer
    if sd is None or optimizer is None:
        return out
    k, n = _place(optimizer, unit.masters[unit.tied])
    renumber = {i: i - (i > k) for i in range(n) if i != k}
    groups = [{**g, "params": [renumber[i] for i in g["params"] if i != k]}
              for g in sd["param_groups"]]
    out["optim"] = {"state": {renumber[i]: v for i, v in sd["state"].items() if i != k},
                    "param_groups": [g for g in groups if g["params"]]}
    return out


def split_head(head: dict, embedding: dict, unit) -> dict:
    """The head's unit state with the copy made from the embedding's unit state (both as
    checkpoints hold them): its weight, its AdamW state and its outer state where there are
    some; `unit` the head's UnitState."""
    out = {**head, "weights": {**head["weights"],
                               COPY_NAME: embedding["weights"][EMBEDDING_NAME]}}
    if head.get("outer") and embedding.get("outer"):
        at = _outer_region(unit).start
        out["outer"] = {k: torch.cat([v[:at], embedding["outer"][k], v[at:]])
                        for k, v in head["outer"].items()}
    optimizer = unit.optimizer
    if head["optim"] is None or optimizer is None:
        return out
    k, n = _place(optimizer, unit.masters[unit.tied])
    sources = [head["optim"]["state"].get(j) for j in range(n - 1)]  # the head's own, in order
    sources.insert(k, (embedding["optim"] or {"state": {}})["state"].get(0))
    state = {i: source for i, source in enumerate(sources) if source is not None}
    out["optim"] = {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}
    return out
