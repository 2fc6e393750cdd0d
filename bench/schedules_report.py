"""The analysis half of bench/schedules.py: the lower bound of a layout's step time (1F1B's), the
summaries and within-round ratios of the implementations a run had, and the tables printed.

An implementation is the dict bench/schedules_implementations.py describes and the result
records."""

from __future__ import annotations

import statistics
from itertools import combinations

from ratrain.config import RunConfig

from peers import summary as stat_summary
from schedules_layout import Layout

COMPUTE = ("F", "B", "BI", "BW", "R")  # per-micro-batch compute actions; U (the update) apart
SHORT = {"ratrain": "r", "baseline": "base"}  # in the overview's ratio headers (r/base, r/peer)


def lower_bound(layout: Layout, raw: dict, cfg: RunConfig, rate_bps: float | None) -> dict:
    """max(compute including the 1F1B bubble, bytes crossing the slow link per direction / rate):
    the 1F1B bound. A split backward (zbh1, torch's zero bubble) fills part of that bubble with
    weight gradients, so its step can be shorter than the pipeline term.

    compute = max(pipeline, cpu), from t[s], the forward + backward time of one micro-batch on
    stage s measured alone (bench/schedules_worker.py's `_compute_alone`; the fastest of the
    stage's replicas, which all do the same work):
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


def ratio_pairs(impls: list[dict]) -> list[tuple[str, str]]:
    """The within-round ratios a / b: ratrain against baseline and every peer; every split-backward
    engine against ratrain (1F1B), baseline and every split-backward peer (its like); the auto
    row (the default flags' plan) and every unit-major row against baseline and ratrain."""
    peers = [d["name"] for d in impls if d["kind"] == "peer"]
    split = {kind: [d["name"] for d in impls if d["kind"] == kind and d["split_backward"]]
             for kind in ("engine", "peer")}
    auto = [(a, b) for a in ["auto", *(d["name"] for d in impls if d.get("group"))]
            for b in ("baseline", "ratrain") if any(d["name"] == a for d in impls)]
    return ([("ratrain", b) for b in ("baseline", *peers)] + auto
            + [(a, b) for a in split["engine"] for b in ("ratrain", "baseline", *split["peer"])])


def _names(res: dict) -> list[str]:
    return [d["name"] for d in res["implementations"]]


def analyse(layout: Layout, raw: dict, cfg: RunConfig, rate_bps: float | None) -> dict:
    tokens_per_step = cfg.train.global_batch * cfg.train.seq_len
    impls = _names(raw)
    rates = {impl: [row[impl]["tokens_per_s"] for row in raw["rounds"]] for impl in impls}
    bound = lower_bound(layout, raw, cfg, rate_bps)
    summary = {}
    for impl in impls:
        s = stat_summary(rates[impl])
        s["step_s"] = tokens_per_step / s["median"]
        s["step_over_bound"] = s["step_s"] / bound["bound_s"]
        summary[impl] = s
    paired = {}
    for a, b in ratio_pairs(raw["implementations"]):
        ratios = [x / y for x, y in zip(rates[a], rates[b])]
        paired[f"{a}_vs_{b}"] = {**stat_summary(ratios), "per_round": ratios}
    # Every implementation walks the loader's steps in order: its k-th loss is step k's.
    seqs = {impl: raw["warmup"][impl]["losses"] + [x for row in raw["rounds"] for x in row[impl]["losses"]]
            for impl in impls}
    diffs = {f"{a}_vs_{b}": max(abs(x - y) for x, y in zip(seqs[a], seqs[b]))
             for a, b in combinations(impls, 2)}
    return {"summary_tokens_per_s": summary, "paired_ratios": paired, "lower_bound": bound,
            "max_abs_loss_difference": diffs, "n_losses_compared": len(seqs["ratrain"]),
            "first_step_loss": {impl: seqs[impl][0] for impl in impls},
            "last_step_loss": {impl: seqs[impl][-1] for impl in impls}}


def print_layout(layout: Layout, res: dict) -> None:
    s, b = res["summary_tokens_per_s"], res["lower_bound"]
    width = max(38, *(len(d["label"]) for d in res["implementations"]))
    header = (f"{'implementation':<{width}} {'tok/s median':>12} {'min':>7} {'max':>7} {'step s':>7} "
              f"{'/ bound':>7}")
    print(header)
    print("-" * len(header))
    for d in res["implementations"]:
        x = s[d["name"]]
        print(f"{d['label']:<{width}} {x['median']:>12.0f} {x['min']:>7.0f} {x['max']:>7.0f} "
              f"{x['step_s']:>7.3f} {x['step_over_bound']:>7.2f}")
    for key, p in res["paired_ratios"].items():
        print(f"{key.replace('_vs_', ' / ')} within each round: median {p['median']:.3f} "
              f"(min {p['min']:.3f}, max {p['max']:.3f})")
    line = f"1F1B bound {b['bound_s']:.3f} s = max(compute {b['compute_s']:.3f} s"
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
          f"over {res['n_losses_compared']} steps: "
          + ", ".join(f"{k.replace('_vs_', '-')} {v:.3g}" for k, v in d.items()))


def _ratio_header(key: str) -> str:
    return "/".join(SHORT.get(impl, impl) for impl in key.split("_vs_"))


def print_overview(results: list[dict]) -> None:
    """One row per layout, a column per implementation and ratio any layout had ('-' where
    this one lacks it)."""
    impls = list(dict.fromkeys(n for res in results for n in _names(res)))
    pairs = list(dict.fromkeys(k for res in results for k in res["paired_ratios"]))
    rates = [(n, max(len(n) + 1, 8)) for n in impls]
    ratios = [(k, max(len(_ratio_header(k)) + 1, 7)) for k in pairs]
    over = [(n, max(len(n) + 1, 6)) for n in impls]

    def group(title: str, cols: list) -> str:
        return f" {title:^{sum(w for _, w in cols) + len(cols) - 1}}"

    def cells(cols: list, values: dict, fmt: str) -> str:
        return "".join(f" {values[k]:>{w}{fmt}}" if k in values else f" {'-':>{w}}"
                       for k, w in cols)

    print(f"{'':<18}{group('tokens/s (median)', rates)}{group('within-round', ratios)} {'':>8}"
          f"{group('step time / 1F1B bound', over)}")
    header = (f"{'config':<18}" + "".join(f" {n:>{w}}" for n, w in rates)
              + "".join(f" {_ratio_header(k):>{w}}" for k, w in ratios) + f" {'bound s':>8}"
              + "".join(f" {n:>{w}}" for n, w in over))
    print(header)
    print("-" * len(header))
    for res in results:
        s, p = res["summary_tokens_per_s"], res["paired_ratios"]
        print(f"{res['layout']['key']:<18}"
              + cells(rates, {n: x["median"] for n, x in s.items()}, ".0f")
              + cells(ratios, {k: x["median"] for k, x in p.items()}, ".3f")
              + f" {res['lower_bound']['bound_s']:>8.3f}"
              + cells(over, {n: x["step_over_bound"] for n, x in s.items()}, ".2f"))
