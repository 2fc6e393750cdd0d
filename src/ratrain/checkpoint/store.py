"""One unit's files in a checkpoint: its weights as safetensors, its AdamW state in torch's
format (loaded with weights_only=True, so a checkpoint cannot run code)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ratrain.checkpoint import manifest
from ratrain.file_modes import with_usual_mode


def _replica(replica: int) -> str:
    # replicas other than 0 have local state of their own only with --sync diloco
    return f".replica_{replica}" if replica else ""


def weights_file(unit: int, replica: int = 0) -> str:
    return f"unit_{unit:04d}{_replica(replica)}.safetensors"


def optim_file(unit: int, replica: int = 0) -> str:
    return f"unit_{unit:04d}{_replica(replica)}.optim.pt"


def outer_file(unit: int) -> str:
    """--sync diloco: the unit's outer parameters and momentum (the same on every replica)."""
    return f"unit_{unit:04d}.outer.pt"


def write_unit(directory: Path, unit: int, state: dict, replica: int = 0,
               outer: bool = True) -> dict[str, dict]:
    """Write unit `unit`'s weights and optimizer state, and where `outer` its --sync diloco
    outer state (the same on every replica: one replica of each directory writes it), each
    flushed to disk; returns their manifest entries."""
    written = {}
    path = directory / weights_file(unit, replica)
    try:
        save_file({k: t.detach().cpu().contiguous() for k, t in state["weights"].items()}, path)
    except SafetensorError as e:  # how safetensors reports a failed write (a full disk)
        raise OSError(str(e).split("I/O error: ")[-1]) from e
    with_usual_mode(path)  # (safetensors makes it 0600)
    written[path.name] = _synced(path)
    if state["optim"] is not None:
        path = directory / optim_file(unit, replica)
        _torch_save(_own_storage(state["optim"]), path)
        written[path.name] = _synced(path)
    if state.get("outer") is not None and outer:
        path = directory / outer_file(unit)
        _torch_save(state["outer"], path)
        written[path.name] = _synced(path)
    return written


def _torch_save(obj, path: Path) -> None:
    """torch.save into a file object, whose writes release the GIL. Into memory (io.BytesIO,
    until 2026-11-27) the serialization held it: the training thread ran at 22-31% of its pace
    while a background save serialized 1.7 GB of AdamW state (docs/checkpoints.md). A failed
    write (a full disk) comes out of torch as an opaque RuntimeError ("unexpected pos 704 vs
    598") with the file's OSError as its context: that OSError is raised. So is a Ctrl-C (or
    SIGTERM's _Terminated) that lands in a write: a --checkpoint-sync save stopped by it ended
    in that RuntimeError's traceback, exit 1 (until 2026-12-03)."""
    with open(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            if isinstance(e.__context__, (OSError, KeyboardInterrupt)):
                raise e.__context__ from None
            raise


def _own_storage(obj):
    """`obj` with each tensor that is a view into a larger storage copied out: torch.save writes
    a tensor's whole storage, so a live state's file and its snapshot's (saving.py) would
    differ, and the file would hold bytes that are not the tensor's."""
    if isinstance(obj, torch.Tensor):
        whole = obj.storage_offset() == 0 and obj.is_contiguous() and \
            obj.untyped_storage().nbytes() == obj.numel() * obj.element_size()
        return obj if whole else obj.clone()
    if isinstance(obj, dict):
        return {k: _own_storage(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_own_storage(v) for v in obj)
    return obj


def _synced(path: Path) -> dict:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return manifest.digest(path)


def read_unit(ckpt: Path, unit: int, files: dict, device: torch.device,
              replica: int = 0) -> dict:
    """Unit `unit`'s state from a checkpoint whose manifest lists `files`. The caller has
    verified the files (or verifies them now, see load_units)."""
    weights = load_file(ckpt / weights_file(unit, replica), device=str(device))
    optim = outer = None
    if optim_file(unit, replica) in files:
        optim = torch.load(ckpt / optim_file(unit, replica), map_location=device, weights_only=True)
    if outer_file(unit) in files:  # --sync diloco's; `replica` (its own local state, or 0's)
        outer = torch.load(ckpt / outer_file(unit), map_location=device, weights_only=True)
    return {"weights": weights, "optim": optim, "outer": outer}


def outer_weights(module: torch.nn.Module, state: dict) -> dict[str, torch.Tensor]:
    """A unit's weights with its --sync diloco outer parameters in place of a replica's local
    ones: the outer file holds them flat, in the order of the module's parameters."""
    weights = dict(state["weights"])
    flat, at = state["outer"]["params"], 0
    for name, p in module.named_parameters():
        weights[name] = flat[at:at + p.numel()].view_as(p).clone()
        at += p.numel()
    if at != flat.numel():
        raise ValueError(f"the outer parameters hold {flat.numel()} values, the unit {at}")
    return weights
