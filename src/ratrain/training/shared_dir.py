"""Under torchrun the ranks may be on several machines whose checkpoint directories are not the
same one: node-local disks, typical of two sites joined by a WAN for --sync diloco. Before the
first step every rank writes a file into the directory and looks for everyone's: the ranks that
see each other's files share a directory. Where they all do, a checkpoint is one directory that
rank 0 publishes; where they do not, each directory holds a checkpoint of its own ranks' part,
published by its lowest rank (node-local checkpoints), and a resume takes the newest step every
directory holds (`agreed_local_checkpoint`)."""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from ratrain import checkpoint
from ratrain.counts import noun_for
from ratrain.errors import UserError
from ratrain.runtime import timed_comm
from ratrain.schedule.grid import RankGrid

LOOK_FOR_S = 10.0
"""How long a rank looks for the others' files before it takes those it sees: a network
filesystem may show a new file late (the names are new to every rank, so no cached "no such
file" hides them on NFS; a lagging mount might). Node-local directories pay it at every start;
RATRAIN_SHARED_DIR_WAIT_S sets it (shorter where the directories are known to be local)."""

_PROBE = ".ratrain-shared-{}-{:05d}"


@dataclass(frozen=True)
class DirectoryShare:
    """The ranks that see the same checkpoint directory as this rank, lowest first (every rank
    of the world where the directory is shared), and how many directories the world's ranks
    see between them."""

    ranks: tuple[int, ...]
    directories: int = 1

    @property
    def publisher(self) -> int:
        """The rank that publishes this directory's checkpoints (writes their manifest)."""
        return self.ranks[0]

    @property
    def node_local(self) -> bool:
        return self.directories > 1

    def first_of_stage(self, grid: RankGrid, rank: int, island: int | None = None) -> bool:
        """Whether `rank` is the lowest replica of its stage among the directory's ranks (of
        its island of `island` neighbouring replicas, where given): the one that writes what
        they hold alike (the units of a synchronous run or of an island, --sync diloco's outer
        states)."""
        stage, replica = grid.coords(rank)
        size = island or grid.dp
        return replica == min(r for s, r in map(grid.coords, self.ranks)
                              if s == stage and r // size == replica // size)


def shared_by(directory: Path, rank: int, world: int, timeout_s: float, device: torch.device,
              look_for_s: float | None = None) -> DirectoryShare:
    """Which ranks see the same `directory` (made if missing) as this one; collective. Rank 0
    says on stderr when it is not the same for all. A UserError on every rank where what the
    ranks see does not split them into groups (a filesystem that shows a file to some ranks of
    a node and not to others)."""
    look_for_s = _wait_s() if look_for_s is None else look_for_s  # (before any rank waits)
    when, action = "start of training", "the shared-directory check"
    token = timed_comm.all_gather_object(secrets.token_hex(8) if rank == 0 else None, timeout_s,
                                         when, action, device)[0]
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(_PROBE.format("*", rank)):  # a start that was killed here
        stale.unlink(missing_ok=True)
    own = directory / _PROBE.format(token, rank)
    own.write_text(token)
    deadline = time.monotonic() + look_for_s
    while len(seen := _seen(directory, token)) < world and time.monotonic() < deadline:
        time.sleep(0.5)
    seen.add(rank)  # its own file, whatever a lagging listing shows
    keys = timed_comm.all_gather_object(_key(seen), timeout_s, when, action, device)
    own.unlink(missing_ok=True)  # every rank is done looking
    groups = Counter(keys)
    odd = [r for r, k in enumerate(keys) if groups[k] != k[1]]
    if odd:
        raise UserError(
            f"the checkpoint directory {directory} is not seen alike by ranks that share it: "
            f"{noun_for(len(odd), 'rank')} {', '.join(map(str, odd))} "
            + ("sees files some of the ranks it shares it with" if len(odd) == 1
               else "see files some of the ranks they share it with")
            + " do not (a mount that lags or differs). Put --run-dir, or --checkpoint-dir, on one "
            "filesystem every node mounts, or on each node's own disk, or train with "
            "--no-checkpoints")
    if rank == 0 and len(groups) > 1:
        print(f"the checkpoint directory {directory} is not the same on every node: the ranks see "
              f"{len(groups)} directories (rank 0's is seen by {len(seen)} of {world} ranks). "
              "Each keeps its own ranks' part of every checkpoint; resuming needs each of them, "
              "with the --pp, --dp and rank order the run was saved with, and the same ranks on "
              "each node", file=sys.stderr, flush=True)
    return DirectoryShare(tuple(sorted(seen)), len(groups))


def _wait_s() -> float:
    text = os.environ.get("RATRAIN_SHARED_DIR_WAIT_S", str(LOOK_FOR_S))
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not 0 <= wait < float("inf"):
        raise UserError(f"RATRAIN_SHARED_DIR_WAIT_S={text!r}: give the seconds ranks look for "
                        f"each other's files in the checkpoint directory, 0 or more")
    return wait


def _seen(directory: Path, token: str) -> set[int]:
    prefix = _PROBE.format(token, 0)[:-5]
    found = set()
    for name in (p.name for p in directory.iterdir()):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            found.add(int(name[len(prefix):]))
    return found


def _key(seen: set[int]) -> tuple[int, int, str]:
    """A set of ranks, small to gather from every rank: its lowest, its size and a digest.
    Where the ranks that give one key are as many as its size, they are the set itself (each
    sees its own file): the keys tell a split into groups from anything else."""
    ranks = sorted(seen)
    return ranks[0], len(ranks), hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()


def agreed_local_checkpoint(root: Path, rank: int, chosen: str | None, units, written: set[int],
                            replica: int, timeout_s: float,
                            device: torch.device) -> tuple[str | None, bool]:
    """Node-local checkpoints: the newest step, at most rank 0's `chosen` (the newest of its
    directory that verifies), whose checkpoint every rank's directory holds with the rank's
    `units`, their files whole (hashed here), as a path in this rank's directory, and True
    (hashed, for load_units); (None, True) where rank 0 starts afresh. Rank 0 says on stderr
    which newer ones it skips and why. `written`: the units the ranks of this rank's directory
    save. Collective; a UserError on every rank where no step will do, or where a rank needs a
    unit its directory will not hold (a tied embedding's head on another node than the
    embedding), resuming or not."""
    when, action = "start of training", "the node-local checkpoints' agreement"
    gathered = timed_comm.all_gather_object((chosen, sorted(set(units) - written)), timeout_s,
                                            when, action, device)
    unheld = {r: missing for r, (_, missing) in enumerate(gathered) if missing}
    if unheld:
        r, missing = next(iter(unheld.items()))
        raise UserError(
            f"rank {r} reads {noun_for(len(missing), 'unit')} {', '.join(map(str, missing))} at "
            "a resume (a tied embedding's copy) and no rank that sees its checkpoint directory "
            f"saves {'it' if len(missing) == 1 else 'them'}: the "
            "nodes' own checkpoints could not be resumed. Put --run-dir, or --checkpoint-dir, "
            "on a filesystem every node mounts, place the stages with another --rank-order, or "
            "train with --no-checkpoints")
    chosen = gathered[0][0]
    if chosen is None:
        return None, True
    root, newest = Path(root), checkpoint.step_of(Path(chosen))
    mine = [checkpoint.step_of(c) for c in checkpoint.complete_dirs(checkpoint.Elsewhere(root))
            if checkpoint.manifest.problem(c, hashed=False) is None  # every file at its size
            and not checkpoint.missing_units(c, units, replica)]
    steps = timed_comm.all_gather_object(mine, timeout_s, when, action, device)
    lacking = [r for r, s in enumerate(steps) if newest not in s]
    if lacking and rank == 0:
        print(f"skipping checkpoint step_{newest:06d}: {noun_for(len(lacking), 'rank')} "
              f"{', '.join(map(str, lacking))} "
              + ("does not hold it whole with its units" if len(lacking) == 1
                 else "do not hold it whole with their units"), file=sys.stderr, flush=True)
    common = set(steps[0]).intersection(*steps[1:])
    for step in sorted((s for s in common if s <= newest), reverse=True):
        ckpt = checkpoint.checkpoint_dir(checkpoint.Elsewhere(root), step)
        # each rank hashes its units' files here, not as it loads them: a damaged part then
        # costs every rank this checkpoint, not one rank the run (rank 0 hashed its newest)
        wrong = None if rank == 0 and step == newest else checkpoint.units_problem(
            ckpt, units, replica)
        problems = timed_comm.all_gather_object(wrong, timeout_s, when, action, device)
        bad = [(r, w) for r, w in enumerate(problems) if w]
        if not bad:
            if rank == 0 and step != newest:
                print(f"resuming from step_{step:06d}, the newest checkpoint every node's "
                      "directory holds whole", file=sys.stderr, flush=True)
            return str(ckpt), True
        if rank == 0:
            print(f"skipping checkpoint step_{step:06d}: rank {bad[0][0]}: {bad[0][1]}",
                  file=sys.stderr, flush=True)
    raise UserError(
        f"no checkpoint is whole in every node's directory (rank 0's newest: step_{newest:06d}; "
        "rank 0 says on stderr what each lacks): a node's directory lost or damaged, or the run "
        "resumed with another layout (node-local checkpoints resume with the --pp, --dp, "
        "--sync and rank order they were saved with; `ratrain merge-parts` makes the parts one "
        "checkpoint, which any layout resumes)")
