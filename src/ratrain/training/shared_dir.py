"""Under torchrun the ranks may be on several machines, and a checkpoint is one directory that
every rank writes its part into and rank 0 then publishes. A checkpoint directory that is not
the same on every node (a node-local disk, typical of two sites joined by a WAN for --sync
diloco) was found out only at the first save, as rank 0 waiting out --comm-timeout for parts
written elsewhere. So before the first step rank 0 writes a file there and every rank looks
for it."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import torch

from ratrain.errors import UserError
from ratrain.runtime import timed_comm

LOOK_FOR_S = 10.0
"""How long a rank looks for the file before it says it cannot see it: a network filesystem
may show a new file late (the name is new to every rank, so no cached "no such file" hides
it on NFS; a lagging mount might)."""


def check_shared(directory: Path, rank: int, timeout_s: float, device: torch.device,
                 look_for_s: float = LOOK_FOR_S) -> None:
    """Raise a UserError on every rank unless all of them see the file rank 0 writes into
    `directory` (made if missing); the file is removed afterwards."""
    name = None
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        name = f".ratrain-shared-{secrets.token_hex(8)}"
        (directory / name).write_text(name)
    when, action = "start of training", "the shared-directory check"
    name = timed_comm.all_gather_object(name, timeout_s, when, action, device)[0]
    probe = directory / name
    deadline = time.monotonic() + look_for_s
    while not (seen := _reads(probe, name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    seen_by = timed_comm.all_gather_object(seen, timeout_s, when, action, device)
    if rank == 0:
        probe.unlink(missing_ok=True)
    blind = [r for r, s in enumerate(seen_by) if not s]
    if blind:
        raise UserError(
            f"the checkpoint directory {directory} is not the same on every node: rank(s) "
            f"{', '.join(map(str, blind))} do not see the file rank 0 wrote there (a checkpoint "
            "is one directory that every rank writes its part into). Put --run-dir, or "
            "--checkpoint-dir, on a filesystem every node mounts, or train with "
            "--no-checkpoints")


def _reads(probe: Path, name: str) -> bool:
    try:
        return probe.read_text() == name
    except OSError:
        return False
