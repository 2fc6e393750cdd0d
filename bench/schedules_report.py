"""The analysis half of bench/schedules.py: the lower bound of a layout's step time, the
summaries and within-round ratios of the three implementations, and the tables printed."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ratrain.config import RunConfig

from peers import summary as stat_summary

if TYPE_CHECKING:
    from schedules import Layout

IMPLS = ("ratrain", "baseline", "peer")
COMPUTE = ("F", "B", "R")  # per-micro-batch compute actions; U (the update) is reported apart


def lower_bound(layout: Layout, raw: dict, cfg: RunConfig, rate_bps: float | None) -> dict:
    """max(compute including the 1F1B bubble, bytes crossing the slow link per direction / rate).

    compute = max(pipeline, cpu), from t[s], the forward + backward time of one micro-batch on
    stage s measured alone (bench/schedules.py's `_compute_alone`; the fastest of the stage's replicas, which all do
    the same work):
      pipeline: sum_s t[s] + (n_micro - 1) * max_s t[s]: one micro-batch must pass every stage
                and back, and the slowest stage must do all n_micro (= (n_micro + pp - 1) * t for
                equal stages: 1F1B's bubble);
      cpu:      n_micro * dp * sum_s t[s] / min(ranks, cores): all the ranks' compute on the
                cores there are (more ranks than cores: they share them).
    """
    n = cfg.n_micro
    ranks = raw["ranks"]
    alone = {(r["stage"], r["replica"]): r["compute_alone_per_micro_batch_s"] for r in ranks}
    # The replicas of a stage do the same work: the fastest one's time is the stage's.
    t = [min(alone[(s, rep)] for rep in range(layout.dp)) for s in range(layout.pp)]
    pipeline = sum(t) + (n - 1) * max(t)
    cores = min(r["cores"] for r in ranks)
    cpu = n * layout.dp * sum(t) / min(layout.world, cores)
    compute = max(pipeline, cpu)
    in_run = {}  # the same from ratrain's traces during the timed steps (shared cores included)
    for r in ranks:
        medians = [statistics.median(sum(st.get(c, 0.0) for c in COMPUTE) for st in steps)
                   for steps in r["trace_per_step_s"].values() if steps]
        in_run[f"stage {r['stage']} replica {r['replica']}"] = min(medians) / n
    out = {"compute_s": compute, "pipeline_s": pipeline, "cpu_s": cpu, "cores": cores,
           "per_micro_batch_compute_stage_s": t,
           "per_micro_batch_compute_alone_s": {f"stage {s} replica {rep}": v
                                               for (s, rep), v in sorted(alone.items())},
           "per_micro_batch_compute_in_run_s": in_run,
           "formula": "max(compute = max(sum_s t[s] + (n_micro - 1) * max_s t[s], "
                      "n_micro * dp * sum_s t[s] / min(ranks, cores)), link bytes per direction / rate), "
                      "t[s] = min over the replicas of stage s of the time alone"}
    link = None
    if rate_bps:
        k = layout.world // 2
        rank_of = {(r["stage"], r["replica"]): r["rank"] for r in ranks}
        grad_bytes = {r["stage"]: 4 * r["n_params"] for r in ranks}
        act_bytes = cfg.train.micro_batch_size * cfg.train.seq_len * cfg.model.dim * 4
        cross = {(0, 1): 0, (1, 0): 0}
        act_total = grad_total = 0
        for rep in range(layout.dp):
            for s in range(layout.pp - 1):
                a, b = rank_of[(s, rep)] // k, rank_of[(s + 1, rep)] // k
                if a != b:  # activations a -> b, their gradients b -> a
                    cross[(a, b)] += n * act_bytes
                    cross[(b, a)] += n * act_bytes
                    act_total += n * act_bytes
        for s in range(layout.pp):
            if len({rank_of[(s, rep)] // k for rep in range(layout.dp)}) == 2:
                cross[(0, 1)] += grad_bytes[s]
                cross[(1, 0)] += grad_bytes[s]
                grad_total += grad_bytes[s]
        link_bytes = max(cross.values())
        link = link_bytes * 8 / rate_bps
        out.update(link_s=link, link_bytes_per_direction=link_bytes, rate_bits_per_s=rate_bps,
                   activation_bytes_per_direction=act_total, gradient_bytes_per_direction=grad_total)
    out["bound_s"] = max(compute, link or 0.0)
    return out


def analyse(layout: Layout, raw: dict, cfg: RunConfig, rate_bps: float | None) -> dict:
    tokens_per_step = cfg.train.global_batch * cfg.train.seq_len
    rates = {impl: [row[impl]["tokens_per_s"] for row in raw["rounds"]] for impl in IMPLS}
    bound = lower_bound(layout, raw, cfg, rate_bps)
    summary = {}
    for impl in IMPLS:
        s = stat_summary(rates[impl])
        s["step_s"] = tokens_per_step / s["median"]
        s["step_over_bound"] = s["step_s"] / bound["bound_s"]
        summary[impl] = s
    paired = {}
    for other in ("baseline", "peer"):
        ratios = [a / b for a, b in zip(rates["ratrain"], rates[other])]
        paired[f"ratrain_vs_{other}"] = {**stat_summary(ratios), "per_round": ratios}
    # Every implementation walks the loader's steps in order: its k-th loss is step k's.
    seqs = {impl: raw["warmup"][impl]["losses"] + [x for row in raw["rounds"] for x in row[impl]["losses"]]
            for impl in IMPLS}
    diffs = {f"{a}_vs_{b}": max(abs(x - y) for x, y in zip(seqs[a], seqs[b]))
             for a, b in (("ratrain", "baseline"), ("ratrain", "peer"), ("baseline", "peer"))}
    return {"summary_tokens_per_s": summary, "paired_ratios": paired, "lower_bound": bound,
            "max_abs_loss_difference": diffs, "n_losses_compared": len(seqs["peer"]),
            "first_step_loss": {impl: seqs[impl][0] for impl in IMPLS},
            "last_step_loss": {impl: seqs[impl][-1] for impl in IMPLS}}


def print_layout(layout: Layout, res: dict, names: dict[str, str]) -> None:
    s, b = res["summary_tokens_per_s"], res["lower_bound"]
    header = (f"{'implementation':<38} {'tok/s median':>12} {'min':>7} {'max':>7} {'step s':>7} "
              f"{'/ bound':>7}")
    print(header)
    print("-" * len(header))
    for impl in IMPLS:
        x = s[impl]
        print(f"{names[impl]:<38} {x['median']:>12.0f} {x['min']:>7.0f} {x['max']:>7.0f} "
              f"{x['step_s']:>7.3f} {x['step_over_bound']:>7.2f}")
    for key, p in res["paired_ratios"].items():
        print(f"{key.replace('_vs_', ' / ')} within each round: median {p['median']:.3f} "
              f"(min {p['min']:.3f}, max {p['max']:.3f})")
    line = f"lower bound {b['bound_s']:.3f} s = max(compute {b['compute_s']:.3f} s"
    if "link_s" in b:
        line += (f", link {b['link_bytes_per_direction'] / 1e6:.2f} MB each way / "
                 f"{b['rate_bits_per_s'] / 8e6:.2f} MB/s = {b['link_s']:.3f} s")
    print(line + ")")
    print(f"  compute = max(pipeline {b['pipeline_s']:.3f} s, cpu {b['cpu_s']:.3f} s on {b['cores']} cores); "
          f"forward+backward of one micro-batch, alone:")
    for (k, v), w in zip(b["per_micro_batch_compute_alone_s"].items(),
                         b["per_micro_batch_compute_in_run_s"].values()):
        print(f"    {k}: {v * 1e3:.0f} ms (in the run, from ratrain's traces: {w * 1e3:.0f} ms)")
    d = res["max_abs_loss_difference"]
    f = res["first_step_loss"]
    print(f"losses: first step {', '.join(f'{k} {v:.6f}' for k, v in f.items())}; max |difference| "
          f"over {res['n_losses_compared']} steps: ratrain-baseline {d['ratrain_vs_baseline']:.3g}, "
          f"ratrain-peer {d['ratrain_vs_peer']:.3g}, baseline-peer {d['baseline_vs_peer']:.3g}")


def print_overview(results: list[dict]) -> None:
    header = (f"{'config':<18} {'ratrain':>8} {'baseline':>9} {'peer':>8} {'r/base':>7} {'r/peer':>7} "
              f"{'bound s':>8} {'ratrain':>8} {'baseline':>9} {'peer':>6}")
    print(f"{'':<18} {'tokens/s (median)':^27} {'within-round':^15} {'':>8} "
          f"{'step time / bound':^26}")
    print(header)
    print("-" * len(header))
    for res in results:
        s, p = res["summary_tokens_per_s"], res["paired_ratios"]
        print(f"{res['layout']['key']:<18} {s['ratrain']['median']:>8.0f} {s['baseline']['median']:>9.0f} "
              f"{s['peer']['median']:>8.0f} {p['ratrain_vs_baseline']['median']:>7.3f} "
              f"{p['ratrain_vs_peer']['median']:>7.3f} {res['lower_bound']['bound_s']:>8.3f} "
              f"{s['ratrain']['step_over_bound']:>8.2f} {s['baseline']['step_over_bound']:>9.2f} "
              f"{s['peer']['step_over_bound']:>6.2f}")
