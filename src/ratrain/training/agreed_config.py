"""The same settings on every node under torchrun, checked once the world is joined and before
anything they shape (the link probe's layout, the process groups): every node runs the same
command, but for what names its own files or fits its own machine (NODE_LOCAL), and what
`--schedule auto` chooses on each (CHOSEN: agreed_plan.agreed takes rank 0's)."""

from __future__ import annotations

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.runtime.process_groups import gathered_at_start
from ratrain.training.resume_settings import PATH_FIELDS

CHOSEN = ("schedule", "weight_grad", "micro_batch_group")
"""What --schedule auto chooses on each rank."""

NODE_LOCAL = PATH_FIELDS | {("data", "cache_dir"), ("train", "checkpoint_dir"),
                            ("train", "profile"), ("parallel", "threads_per_rank"),
                            ("parallel", "backend"), ("parallel", "plan_file"),
                            ("parallel", "comm_timeout_s")}
"""Settings a node may give otherwise than the others: its own files (their paths; the data's
content is agreed by agreed_stream), its hardware profile, threads, backend, and how long it
waits for a peer. The rest is the run's: nodes that differ on it diverged without a word (--lr),
aborted in gloo (--sync diloco:3 and :4) or waited --comm-timeout (--steps) until 2026-12-04."""


def agreed_config(cfg: RunConfig) -> None:
    """Refused on every rank, naming the first setting that differs from rank 0's (in config
    order) and where, if the nodes were started with different settings (NODE_LOCAL's aside;
    CHOSEN's are agreed by agreed_plan.agreed). Collective: every rank of the world calls it."""
    mine = {(section, key): value for section, fields in cfg.to_dict().items()
            for key, value in fields.items()
            if (section, key) not in NODE_LOCAL and not (section == "parallel" and key in CHOSEN)}
    settings = gathered_at_start(mine, "the settings' agreement")
    for field, value in settings[0].items():
        apart: dict[str, list[int]] = {}
        for r, theirs in enumerate(settings[1:], 1):
            if theirs.get(field) != value:
                apart.setdefault(repr(theirs.get(field)), []).append(r)
        if apart:
            where = ", ".join(f"{v} on {_ranks(rs)}" for v, rs in apart.items())
            raise UserError(f"the nodes were started with different settings: "
                            f"{'.'.join(field)} is {value!r} on rank 0 and {where} "
                            "(every node runs the same command)")


def _ranks(ranks: list[int]) -> str:
    """The ranks as a line says them ("rank 2", "ranks 2, 5", "ranks 2-63"): runs of neighbours
    as ranges, a node's ranks being consecutive."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    spans = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)
