"""The low-communication option `ratrain plan` sets beside its plans where the link between
replicas is too slow for a gradient sync every step: the fastest listed plan that --sync diloco
can run, priced without its per-step sync and with the smallest H (and fragment count) that
hides the outer sync, or where a stage's replicas span nodes, several to a node, with islands
of a node's replicas (sim/low_comm.py). It is an option, never one of the plans: it changes the
algorithm, so the search does not rank it and `--out` never writes it. Pure Python."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ratrain.planner import layouts, plan_file, search
from ratrain.planner.candidate import Candidate
from ratrain.schedule.outer_sync import EVERY_STEP
from ratrain.sim import low_comm
from ratrain.sim.low_comm import LowComm
from ratrain.sim.simulator import simulate


@dataclass
class Offer:
    rank: int | None  # the listed plan it is of (1-based); None: of a plan not listed
    candidate: Candidate
    low: LowComm
    best_tokens_per_s: float  # plan 1's
    synchronous: bool = True  # False: its layout runs only with the outer sync (host state on
    # GPUs, its micro-batches not in one group: rule.device_grad_sum_for)


def offer(found: search.SearchResult) -> Offer | None:
    """The option for the first listed plan that --sync diloco can run and whose per-step sync
    is worth avoiding, with the periods whose outer state (8 bytes a parameter) still fits the
    budget and that beat plan 1 (else changing the algorithm buys nothing); None where there
    is none. Where no listed plan has two replicas (over a slow link the fastest synchronous
    plan may leave devices idle, and on GPUs whose state must live in host memory no
    synchronous plan can have two), the fastest plan that has is searched for among the
    layouts the outer sync can run, and priced."""
    if not found.best:
        return None
    first = found.best[0].result.tokens_per_s
    listed = [(rank, c) for rank, c in enumerate(found.best, 1) if c.layout.dp >= 2]
    if not listed and found.request.devices >= 2:
        more = search.search(dataclasses.replace(found.request, min_dp=2, outer_sync=True),
                             first_plan_grace=1)
        listed = [(None, c) for c in more.best]
    made = _first(found.request, listed, first)
    if made is not None and made.rank is None:
        lay = made.candidate.layout
        made.synchronous = layouts.refusal(found.request, lay.pp, lay.dp, lay.micro_batch_size,
                                           lay.lifecycle,
                                           lay.lifecycle.micro_batch_group) is None
        if not made.synchronous:  # islands sum every step, as the layout cannot
            made.low.options = [o for o in made.low.options if not o.islands]
            if not made.low.options:
                return None
    return made


def _first(request, listed: list, first: float) -> Offer | None:
    shape = dict(micro_batch_size=None, seq_len=request.seq_len, dtype=request.dtype)
    for rank, cand in listed:
        shape["micro_batch_size"] = cand.layout.micro_batch_size
        shape["threads_per_rank"] = request.threads_of(cand.layout)
        plan, step_s = cand.plan, cand.step_time
        if plan.sync != EVERY_STEP:  # an outer sync's plan (outer_sync search): priced against
            plan = low_comm.diloco_plan(plan, EVERY_STEP)  # the same plan summing every step
            step_s = simulate(plan, request.model, request.profile, **shape).step_time
        low = low_comm.price(plan, request.model, request.profile, step_s, request.steps,
                             **shape)
        if low is None:
            continue
        if not low.worth_it:
            return None  # the fastest plan diloco could run hides its sync: nothing to offer
        devices = [request.device(g) for g in cand.layout.groups]
        tokens = cand.result.tokens_per_s * cand.step_time
        low.options = [o for o in low.options if tokens / o.mean_step_s > first and all(
            r.peak_with_process(d) <= request.limit_of(g)
            and r.host_peak <= request.host_limit_of(g)
            for res in o.results
            for r, d, g in zip(res.ranks, devices, cand.layout.groups))]
        return Offer(rank, cand, low, first) if low.options else None
    return None


def describe(o: Offer) -> str:
    r = o.candidate.layout
    tokens = o.candidate.result.tokens_per_s * o.candidate.step_time
    if o.rank:
        which = f"plan {o.rank}"
    elif o.synchronous:
        which = (f"the fastest synchronous plan on {r.dp} replicas (not listed: plan 1 runs "
                 f"{o.best_tokens_per_s:,.0f} tokens/s)")
    else:
        which = (f"the fastest plan on {r.dp} replicas, its state in host memory, which runs "
                 f"only with --sync diloco as laid out (summed every step, host-homed gradients "
                 f"on GPUs are summed on the device once a step, which needs its {r.n_micro} "
                 f"micro-batches in one group; not listed: plan 1 runs "
                 f"{o.best_tokens_per_s:,.0f} tokens/s)")
    return (f"low-communication option (changes the algorithm; not a plan above): {which}, "
            f"pp {r.pp} x dp {r.dp}, {r.n_micro} x {r.micro_batch_size}: "
            + low_comm.advice(o.low, round(tokens)))


def plan_file_of(o: Offer, cfg, request, profile_file: str | None = None) -> dict:
    """What `ratrain plan --out FILE` writes beside FILE for the option (FILE's .diloco.json):
    its plan with the outer sync of the best period, and the settings and prediction it is for
    (`profile_file`: plan_file.prediction's); `ratrain train --plan` runs it as it runs any
    plan file."""
    best = o.low.best
    data = plan_file.to_dict(dataclasses.replace(
        o.candidate, plan=low_comm.diloco_plan(o.candidate.plan, best.sync)), cfg, request,
        profile_file)
    data["run"]["parallel"]["sync"] = best.sync
    tokens = o.candidate.result.tokens_per_s * o.candidate.step_time
    data["prediction"].update(step_time_s=best.mean_step_s, tokens_per_s=tokens / best.mean_step_s,
                              inner_step_time_s=o.low.inner_s, changes_algorithm=True)
    return data


def to_dict(o: Offer) -> dict:
    best = o.low.best
    tokens = o.candidate.result.tokens_per_s * o.candidate.step_time
    return {"changes_algorithm": True, "of_plan": o.rank, "runs_synchronously": o.synchronous,
            "pp": o.candidate.layout.pp,
            "dp": o.candidate.layout.dp, "sync": best.sync,
            "every": best.every, "fragments": best.fragments, "islands": best.islands,
            "hidden": best.hidden,
            "step_time_s": o.low.step_s, "inner_step_time_s": o.low.inner_s,
            "mean_step_time_s": best.mean_step_s, "tokens_per_s": tokens / best.mean_step_s,
            "outer_bytes_per_replica": best.bytes_per_period,
            "options": [{"sync": x.sync, "mean_step_time_s": x.mean_step_s, "hidden": x.hidden,
                         "islands": x.islands} for x in o.low.options],
            "why": ("islands of replicas" if best.islands else "replicas") + " step alone "
                   "between outer syncs: the loss per token is not the synchronous run's"}
