"""One plan, and one checkpoint to resume from, for every rank under torchrun. There every
rank makes its own plan
(training/prepare.py), and with `--schedule auto` chooses its schedule from what its own node
shows: its free memory, its cores, the moment it read them. Nodes that differ (mixed machines,
one busier than another) could choose differently, and ranks running programs that do not
match wait on each other until --comm-timeout. Once the world is joined, every rank takes rank
0's choice, checked against its own node's memory. Likewise only rank 0 verifies the whole
checkpoint a run resumes from (training/run_dir.resume_point): the others take its choice, and
its word on whether a run is finished (rank_0s). (The settings every node must share:
training/agreed_config.py.)"""

from __future__ import annotations

import os
import sys

from ratrain.config import RunConfig
from ratrain.data.replica import Stream, mapped
from ratrain.data.tokens import stream_fingerprint
from ratrain.errors import UserError
from ratrain.runtime.process_groups import gathered_at_start, join_world
from ratrain.schedule.plan import PipelinePlan
from ratrain.setup import check_memory_fits
from ratrain.training.prepare import plan_here, this_machine
from ratrain.training.agreed_config import CHOSEN

def agreed(cfg: RunConfig, plan: PipelinePlan, rank: int) -> PipelinePlan:
    """`plan` where every rank chose as rank 0 did; else, on the ranks that chose otherwise,
    their plan with rank 0's choice written into cfg. Collective: every rank of the world
    calls it. A choice some node cannot hold is refused on every rank, with that node's
    reason, so that none is left waiting."""
    mine = tuple(getattr(cfg.parallel, k) for k in CHOSEN)
    chosen = gathered_at_start(mine, "the schedule's agreement")
    if all(c == chosen[0] for c in chosen):
        return plan
    refusal = None
    if mine != chosen[0]:
        for key, value in zip(CHOSEN, chosen[0]):
            setattr(cfg.parallel, key, value)
        try:
            plan = plan_here(cfg)  # the schedule is given now: nothing is chosen or probed
            check_memory_fits(cfg, plan, this_machine(cfg))
        except UserError as e:
            refusal = str(e)
    others = ", ".join(f"rank {r}: {_label(c)}" for r, c in enumerate(chosen) if c != chosen[0])
    refusals = gathered_at_start(refusal, "the schedule's agreement")
    refused = [(r, why) for r, why in enumerate(refusals) if why]
    if refused:
        r, why = refused[0]
        raise UserError(f"the ranks chose different schedules on their nodes (rank 0: "
                        f"{_label(chosen[0])}; {others}), and rank 0's cannot run on rank {r}'s: "
                        f"{why}; pass --schedule (and --weight-grad, --micro-batch-group) to "
                        f"choose one for every rank")
    if rank == 0:
        print(f"the ranks chose different schedules on their nodes ({others}); every rank runs "
              f"rank 0's, {_label(chosen[0])}", file=sys.stderr, flush=True)
    return plan


def agreed_checkpoint(resume_from: str | None, rank: int) -> tuple[str | None, bool]:
    """Rank 0's checkpoint to resume from (the newest that verifies: it hashed every file),
    and whether this rank's loading may skip the hashing of its own units' files (rank 0's
    only). Collective: every rank of the world calls it."""
    chosen = gathered_at_start(resume_from, "the checkpoint's agreement")[0]
    return chosen, rank == 0


def agreed_stream(cfg: RunConfig, rank: int, mine: Stream | None) -> Stream | None:
    """The stream this rank reads: its node's first rank's, the one that rank checked (`mine`
    there; the others, which keyed the files again, waited for an entry never written where
    they changed); refused, on every rank, where the nodes' first ranks read different
    streams. Collective: every rank of the world calls it. A fingerprint of the content, not
    the cache key, which differs between nodes' own copies of a corpus (their inodes, their
    ctimes)."""
    fingerprint = mine and (mine[1], stream_fingerprint(mapped(mine).tokens))
    streams = gathered_at_start((mine, fingerprint), "the data's agreement")
    first_here = rank - int(os.environ.get("LOCAL_RANK", 0))
    if streams[first_here][0] is None:  # checked by no one (rank_main called on its own)
        return None
    seen = sorted({f for _, f in streams if f})
    if len(seen) > 1:
        counts = sorted({n for n, _ in seen})
        sizes = (f"{counts[0]:,} tokens each, of different content" if len(counts) == 1 else
                 " and ".join(f"{n:,}" for n in counts) + " tokens")
        raise UserError(f"the data changed while the run started: the nodes read streams of "
                        f"{sizes} from --data {cfg.data.path}; "
                        "rerun once it is no longer being written (a corpus being written, "
                        "an rsync)")
    return tuple(streams[first_here][0])


def rank_0s(value, cfg: RunConfig):
    """Rank 0's `value`, on every rank, the world joined for it (once: the run goes on in it)
    with cfg's backend and --comm-timeout. Collective. For a choice that only rank 0 makes
    before the run (cli/train_resume.py: whether a run is finished, by its hash of the
    checkpoint): a rank that chose for itself and ended left the others waiting."""
    join_world(cfg.parallel.backend, cfg.parallel.comm_timeout_s)
    return gathered_at_start(value, "rank 0's word on the checkpoint")[0]


def _label(choice: tuple) -> str:
    schedule, weight_grad, group = choice
    return (schedule + (f" {weight_grad}" if weight_grad else "")
            + (f" in groups of {group}" if group and group > 1 else ""))
