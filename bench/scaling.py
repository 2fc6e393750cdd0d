"""Weak and strong scaling of llama2-7b on the `mt3000` profile, 8 to 1024 devices: simulated.

Nothing here runs a model. At each cluster size the planner (`planner.search`, as `ratrain
plan --profile mt3000 --devices N` calls it) searches for the fastest plan that fits the memory
budget, once with `--policy ratrain` and once with `--policy baseline`, and the simulator's step
time of that plan gives the predicted tokens/s. So every figure is a prediction on the profile's
assumed MT-3000 figures (only its 20 GB per device is the paper's), not a measurement.

* Strong scaling: the global batch is fixed (default 1024 sequences x 4096 tokens, LLaMA-2's 4M
  tokens a step) whatever the cluster size.
* Weak scaling: the work per device is fixed: `--sequences-per-device` (default 1) sequences a
  step per device, so the global batch is that times the devices (8 at 8 devices, 1024 at 1024:
  the two studies meet at 1024). The planner chooses pp and dp, so "per data-parallel replica"
  is pp sequences here; per device it is the same at every size.

Scaling efficiency = (tokens/s per device) / (tokens/s per device at the smallest size where
that policy's search found a plan), per policy and study; per device counts every device of the
cluster, also those a plan leaves idle. Where nothing fits, the planner's own account of why
(`planner.account`) goes into the JSON and its first lines into the table.

    python bench/scaling.py [--devices 8,16,32,64,128,256,512,1024] [--studies weak,strong]
                            [--sequences-per-device 1] [--strong-batch 1024] [--seq-len 4096]
                            [--budget 20e9] [--time-limit 60]
                            [--out bench/results/scaling.json] [--plot docs/scaling.png]
    python bench/scaling.py --replot    # table and plot again from the JSON, no search

With --out elsewhere the plot goes beside it (its name, .png) unless --plot says where.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ratrain.cli.plan_cmd import in_runs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from outputs import draw, outputs, write_results  # noqa: E402
from peers import machine  # noqa: E402

POLICIES = ("ratrain", "baseline")
SLOW_SEARCH_S = 30.0
# The RATrain paper's own figures (its abstract), measured on a real MT-3000.
PAPER = {"model": "llama2-7b", "devices": 1024, "tokens_per_s": 112790.55,
         "scaling_efficiency": 0.970, "source": "RATrain paper (abstract), measured on MT-3000"}


def global_batch(study: str, devices: int, args) -> int:
    return args.sequences_per_device * devices if study == "weak" else args.strong_batch


def plan_at(study: str, devices: int, policy: str, args) -> dict:
    from ratrain.models.presets import get_preset
    from ratrain.planner.account import account
    from ratrain.planner.search import PlanRequest, layouts, search
    from ratrain.sim.profile import load_profile

    model = get_preset(args.model)
    batch = global_batch(study, devices, args)
    request = PlanRequest(model, load_profile(args.profile), devices, batch, args.seq_len,
                          args.dtype, budget=args.budget, policy=policy, top=1,
                          time_limit_s=args.time_limit)
    t0 = time.perf_counter()
    found = search(request)
    entry = {"study": study, "devices": devices, "policy": policy, "global_batch": batch,
             "tokens_per_step": batch * args.seq_len, "search_s": time.perf_counter() - t0,
             "complete": found.complete, "layouts": found.layouts, "simulated": found.simulated}
    if found.best:
        c = found.best[0]
        L = c.layout
        entry.update(
            pp=L.pp, dp=L.dp, devices_used=L.devices, n_micro=L.n_micro,
            micro_batch_size=L.micro_batch_size, rank_order=L.rank_order,
            state_home=L.lifecycle.state_home, shard_state=L.lifecycle.shard_state,
            grad_lifetime=L.lifecycle.grad_lifetime, shard_group=L.lifecycle.shard_group,
            view_window=L.lifecycle.view_window, schedule=L.schedule, weight_grad=L.weight_grad,
            partition=[b - a for a, b, _ in c.partition],
            stage_choices=c.choices(model.n_layers + 2), step_time_s=c.step_time,
            tokens_per_s=c.result.tokens_per_s,
            tokens_per_s_per_device=c.result.tokens_per_s / devices,
            bubble=c.result.bubble, max_stage_bytes=max(c.stage_bytes))
    else:
        refused: list[str] = []
        if not found.layouts:
            layouts(request, refused)
        t1 = time.perf_counter()
        # the account simulates the closest plan, so it is timed apart from the search
        entry["account"] = (f"no layout can run: {refused[0]}" if refused
                            else account(request))
        entry["account_s"] = time.perf_counter() - t1
    return entry


def efficiencies(rows: list[dict]) -> None:
    """Per study and policy, against the smallest size with a plan."""
    for study in {r["study"] for r in rows}:
        for policy in POLICIES:
            series = sorted((r for r in rows if r["study"] == study and r["policy"] == policy
                             and "tokens_per_s" in r), key=lambda r: r["devices"])
            if not series:
                continue
            ref = series[0]
            for r in series:
                r["reference_devices"] = ref["devices"]
                r["scaling_efficiency"] = (r["tokens_per_s_per_device"]
                                           / ref["tokens_per_s_per_device"])


def _plan_text(r: dict) -> str:
    views = ("-" if r["view_window"] is None else "resident" if r["view_window"] == 0
             else f"window {r['view_window']}")
    used = "" if r["devices_used"] == r["devices"] else f" ({r['devices_used']} used)"
    return (f"pp={r['pp']} dp={r['dp']}{used}, {r['n_micro']} x {r['micro_batch_size']}, "
            f"{r['rank_order']}, {r['state_home']}{', sharded' if r['shard_state'] else ''}, "
            f"views {views}, {' '.join(filter(None, (r.get('schedule'), r.get('weight_grad'))))}")


def report(result: dict) -> str:
    lines = []
    for study in result["studies"]:
        rows = [r for r in result["rows"] if r["study"] == study]
        title = ("weak scaling: " + f"{result['settings']['sequences_per_device']} sequence(s) "
                 f"of {result['settings']['seq_len']} tokens per device per step"
                 if study == "weak" else
                 f"strong scaling: global batch {result['settings']['strong_batch']} x "
                 f"{result['settings']['seq_len']} tokens")
        lines += ["", f"{title}", "",
                  "| devices | global batch | policy | plan | activations per stage | "
                  "predicted tokens/s | per device | scaling efficiency | bubble | "
                  "largest stage (GB) | search (s) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            search_s = f"{r['search_s']:.1f}" + ("" if r["complete"] else " (time limit)")
            if "tokens_per_s" not in r:
                why = r["account"].splitlines()
                closest = why[1].strip() if len(why) > 1 else why[0]
                lines.append(f"| {r['devices']} | {r['global_batch']} | {r['policy']} | "
                             f"nothing fits: {closest} | | - | - | - | - | - | {search_s} |")
                continue
            lines.append(
                f"| {r['devices']} | {r['global_batch']} | {r['policy']} | {_plan_text(r)} | "
                f"{in_runs(r['stage_choices'])} | {r['tokens_per_s']:,.0f} | "
                f"{r['tokens_per_s_per_device']:.1f} | {r['scaling_efficiency']:.1%} "
                f"(vs {r['reference_devices']}) | {r['bubble']:.1%} | "
                f"{r['max_stage_bytes'] / 1e9:.2f} | {search_s} |")
        rate = {(r["devices"], r["policy"]): r["tokens_per_s"] for r in rows
                if "tokens_per_s" in r}
        ratios = [f"{d}: {rate[d, 'ratrain'] / rate[d, 'baseline']:.2f}x"
                  for d in result["settings"]["devices"]
                  if (d, "ratrain") in rate and (d, "baseline") in rate]
        if ratios:
            lines.append(f"\nratrain over baseline ({study}): " + ", ".join(ratios))
    slow = [r for r in result["rows"] if r["search_s"] > SLOW_SEARCH_S]
    for r in slow:
        lines.append(f"slow search: {r['study']} {r['devices']} devices {r['policy']}: "
                     f"{r['search_s']:.1f} s")
    p = PAPER
    lines.append(f"\nthe paper (measured on MT-3000): {p['model']} on {p['devices']} clusters, "
                 f"{p['tokens_per_s']:,.2f} tokens/s, {p['scaling_efficiency']:.1%} scaling "
                 f"efficiency")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = result["studies"]
    fig, axes = plt.subplots(2, len(studies), figsize=(6.5 * len(studies), 8), squeeze=False,
                             sharex=True)
    colors = {"ratrain": "tab:blue", "baseline": "tab:orange"}
    for col, study in enumerate(studies):
        top, bottom = axes[0][col], axes[1][col]
        for policy in POLICIES:
            series = sorted((r for r in result["rows"] if r["study"] == study
                             and r["policy"] == policy and "tokens_per_s" in r),
                            key=lambda r: r["devices"])
            if not series:
                continue
            d = [r["devices"] for r in series]
            ref = series[0]
            top.plot(d, [r["tokens_per_s"] for r in series], "o-", color=colors[policy],
                     label=f"{policy} (simulated)")
            top.plot(d, [ref["tokens_per_s"] * x / ref["devices"] for x in d], ":",
                     color=colors[policy], label=f"{policy}: ideal from {ref['devices']}")
            bottom.plot(d, [r["scaling_efficiency"] for r in series], "o-",
                        color=colors[policy], label=policy)
        p = PAPER
        # The abstract gives neither the paper's batch nor the size its efficiency is measured
        # against, so its point sits beside both studies as the paper's, not as a comparison.
        top.plot([p["devices"]], [p["tokens_per_s"]], "k*", markersize=12,
                 label="the paper's figure, measured on MT-3000")
        bottom.plot([p["devices"]], [p["scaling_efficiency"]], "k*", markersize=12,
                    label="the paper's 97.0% (its own reference size)")
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        top.set_ylabel("tokens/s")
        s = result["settings"]
        top.set_title(f"{study} scaling, {s['model']} on {s['profile']} (simulated)"
                      if study == "strong" else
                      f"weak scaling, {s['sequences_per_device']} x {s['seq_len']} tokens per "
                      f"device (simulated)")
        top.grid(True, which="both", alpha=0.3)
        top.legend(fontsize=8)
        bottom.axhline(1.0, color="grey", linewidth=0.8)
        bottom.set_xscale("log", base=2)
        bottom.set_xlabel("devices")
        bottom.set_ylabel("scaling efficiency (per device vs smallest fit)")
        bottom.grid(True, which="both", alpha=0.3)
        bottom.legend(fontsize=8)
        bottom.set_xticks(s["devices"])
        bottom.set_xticklabels([str(x) for x in s["devices"]])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated device counts, got {text!r}") from None
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"device counts must be >= 1, got {text!r}")
    return sizes


def _studies(text: str) -> list[str]:
    studies = [s for s in text.split(",") if s]
    if not studies or any(s not in ("weak", "strong") for s in studies):
        raise argparse.ArgumentTypeError(f"weak and/or strong, got {text!r}")
    return studies


def main() -> None:
    from ratrain.errors import UserError
    from ratrain.models.presets import get_preset
    from ratrain.sim.profile import load_profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--profile", default="mt3000")
    ap.add_argument("--devices", type=_sizes, default="8,16,32,64,128,256,512,1024",
                    help="comma-separated cluster sizes")
    ap.add_argument("--studies", type=_studies, default="weak,strong")
    ap.add_argument("--sequences-per-device", type=int, default=1,
                    help="weak scaling: sequences a step per device")
    ap.add_argument("--strong-batch", type=int, default=1024,
                    help="strong scaling: sequences a step, whatever the size")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--budget", type=float, default=20e9, help="bytes per device")
    ap.add_argument("--time-limit", type=float, default=60.0,
                    help="seconds per search before it returns its best unproven plan")
    ap.add_argument("--out", help="the JSON [default: bench/results/scaling.json]")
    ap.add_argument("--plot", help="'' for none [default: beside --out, as .png; "
                                   "docs/scaling.png for the default --out]")
    ap.add_argument("--replot", action="store_true",
                    help="no search: redraw the table and plot from the JSON at --out")
    args = ap.parse_args()
    out, png = outputs(args.out, args.plot, ROOT / "bench/results/scaling.json",
                       ROOT / "docs/scaling.png")
    if args.replot:
        if not out.is_file():
            ap.error(f"--replot: --out {out} does not exist")
        result = json.loads(out.read_text())
    else:
        try:
            get_preset(args.model)  # refused before the first search, not during it
            load_profile(args.profile)
            result = study(args)
        except UserError as e:
            ap.exit(2, f"error: {e}\n")
        write_results(out, result)
    draw(plot, result, png)
    print(report(result))


def study(args) -> dict:
    """Every study's searches at every size for both policies, with their efficiencies."""
    rows = []
    for name in args.studies:
        for devices in args.devices:
            for policy in POLICIES:
                row = plan_at(name, devices, policy, args)
                rows.append(row)
                got = (f"{row['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in row
                       else "nothing fits")
                print(f"{name} {devices} {policy}: {got} (search {row['search_s']:.1f} s)",
                      file=sys.stderr, flush=True)
    efficiencies(rows)
    return {"date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:], "machine": machine(),
            "simulated": True,
            "note": "predictions of the simulator on the profile's assumed figures; "
                    "nothing was measured on an MT-3000",
            "settings": {"model": args.model, "profile": args.profile, "devices": args.devices,
                         "sequences_per_device": args.sequences_per_device,
                         "strong_batch": args.strong_batch, "seq_len": args.seq_len,
                         "dtype": args.dtype, "budget_bytes": args.budget,
                         "time_limit_s": args.time_limit},
            "studies": args.studies, "paper": PAPER, "rows": rows}


if __name__ == "__main__":
    main()
