"""The single-process reference of low-communication training (--sync diloco): the dp replicas
run in turn in this process, each a plain LocalEngine (whole-model autograd, its own
clip_grad_norm_ and AdamW) on its own batches, and the outer step is written here once more,
per parameter, in plain torch, apart from the runtime's (runtime/outer_sync.py). A
multi-process run of the same config must compute the same run (tests/distributed/
test_diloco.py).

The algorithm is schedule/outer_sync.py's: after inner steps kH every unit's mean delta
(outer - local) steps the outer parameters by Nesterov SGD and every replica continues from
them; streaming (diloco:H:F), fragment f's deltas are taken before step off_f + kH, the outer
step lands after it, and the result is mixed into the local parameters that moved on. The
run's last step syncs every unit whose steps the outer parameters do not hold yet.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from ratrain.config import RunConfig
from ratrain.data.replica import make_data
from ratrain.data.tokenizer import load_tokenizer
from ratrain.runtime.engine import LocalEngine
from ratrain.runtime.optim import lr_at
from ratrain.schedule.outer_sync import parse_sync


@dataclass
class ReferenceRun:
    losses: list[float] = field(default_factory=list)  # per step, the mean over the replicas
    replicas: list[LocalEngine] = field(default_factory=list)
    outer: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # unit -> its outer params
    momentum: dict[int, list[torch.Tensor]] = field(default_factory=dict)


def run_reference(cfg: RunConfig, steps: int | None = None) -> ReferenceRun:
    """`steps` (default: the config's) steps of cfg's --sync diloco run, in this process. With
    K islands, of the run of K replicas without islands: an island's replicas split its batch
    (the loader gives a replica neighbouring rows) and sum their gradients every step, which
    is the arithmetic of one replica of the island's rows in another order."""
    sync = parse_sync(cfg.parallel.sync)
    if sync is None:
        raise ValueError("the DiLoCo reference needs --sync diloco:...")
    if sync.islands:
        cfg = copy.deepcopy(cfg)
        cfg.parallel.dp = sync.islands
        cfg.parallel.sync = cfg.parallel.sync.rsplit(":islands=", 1)[0]
        sync = parse_sync(cfg.parallel.sync)
    dp, t = cfg.parallel.dp, cfg.train
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    loaders = [make_data(cfg, tokenizer, dp, r)[0] for r in range(dp)]
    device = torch.device("cpu")
    run = ReferenceRun(replicas=[LocalEngine(cfg, device) for _ in range(dp)])
    n_units = cfg.model.n_units
    local = [{u: e.stage.state[u].masters for u in range(n_units)} for e in run.replicas]
    with torch.no_grad():
        run.outer = {u: [p.detach().clone() for p in local[0][u]] for u in range(n_units)}
        run.momentum = {u: [torch.zeros_like(p) for p in run.outer[u]] for u in range(n_units)}
    for step in range(steps if steps is not None else t.steps):
        final = sync.final_sync_due(step, t.steps)  # every unit, its delta taken after the step
        fragment = sync.fragment_due(step)
        due = [u for u in range(n_units) if final or (
            fragment is not None and sync.fragment_of(u, n_units) == fragment)]
        if sync.streaming and not final:  # the deltas of the step's fragment, taken before it
            deltas = _deltas(run, local, due, sync.delta_dtype)
        lr = lr_at(step, t)
        results = [e.train_step(next(loader), lr, step) for e, loader in zip(run.replicas, loaders)]
        run.losses.append(sum(r.loss for r in results) / dp)
        if final or not sync.streaming:
            deltas = _deltas(run, local, due, sync.delta_dtype)
        _outer_step(run, local, deltas, cfg, t.outer_mix if sync.streaming else None)
    return run


def _deltas(run: ReferenceRun, local, units, dtype: str) -> dict[int, list[torch.Tensor]]:
    """Per unit and parameter, the replicas' deltas summed (in the dtype they travel in)."""
    kind = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    out = {}
    for u in units:
        per_replica = [[(o - p.detach()).to(kind) for o, p in zip(run.outer[u], rep[u])]
                       for rep in local]
        out[u] = [sum(parts[1:], parts[0]) for parts in zip(*per_replica)]
    return out


@torch.no_grad()
def _outer_step(run: ReferenceRun, local, deltas, cfg: RunConfig, mix: float | None) -> None:
    """torch.optim.SGD(nesterov=True)'s step on each due unit, then the merge."""
    dp, mu, lr = cfg.parallel.dp, cfg.train.outer_momentum, cfg.train.outer_lr
    for u, summed in deltas.items():
        for i, total in enumerate(summed):
            grad = total.float() / dp
            m = run.momentum[u][i]
            m.mul_(mu).add_(grad)
            run.outer[u][i].sub_(grad + mu * m, alpha=lr)
            for rep in local:
                if mix is None:
                    rep[u][i].copy_(run.outer[u][i])
                else:
                    rep[u][i].mul_(mix).add_(run.outer[u][i], alpha=1 - mix)
