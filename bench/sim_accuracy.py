"""The simulator against measurement: predicted and measured step time and peak memory per rank.

On this machine: a profile measured by `ratrain profile` (or --profile FILE), then for each
configuration a real `ratrain train --plan FILE` run (its own processes, gloo, 1 thread per
rank) and `simulate` on the very same plan. Configurations cover pp, dp, micro-batching, both
policies, activation policies, and two runs as two nodes over a tbf rate-limited link between
network namespaces (root; skipped with a line where namespaces cannot be made).

Every configuration runs once per round (`--rounds`, the order reversed in even rounds, so a
shared machine's drift hits all alike). Without --profile, `ratrain profile` measures one repeat
before each round and one after the last, and the simulator reads their merge (the median of
every figure, as `ratrain profile --repeats N` merges back-to-back repeats): on a VM whose speed
drifts by 10-15% within an hour (2026-11-25), a profile taken only before the runs moved every
prediction together. The table also gives the error from the first repeat alone (the machine
profiled once, beforehand) and how far the rounds of one configuration differ from each other:
what a perfect simulator's error would be against a single round.

Measured: the median step time over the steps after the first two, its median over rounds; per
rank the executor's ledger peak and the process's peak RSS growth (metrics.jsonl; RSS: median
over rounds). Predicted: the simulated step time; per stage the simulated ledger peak, and the
RSS growth it implies (RankTimeline.rss_growth: the ledger's growth from before the first step
plus the profile's process overhead). The error of each is (predicted - measured) / measured.

Sets of configurations: `in`, the shape the profile measured (tiny, 256 tokens, micro-batches
of 2), whose unit times the simulator reads; `out`, shapes it did not measure (the `small` and
`tiny-gqa` presets, 64 to 512 tokens, micro-batches of 1 and 4, an uneven partition, three
stages, per-stage recompute, sharded state, the slow link), priced from FLOPs and the profile's
rates: the simulator out of sample; `split`, split backwards (zbh1, grouped weight gradients)
beside 1F1B on the same layouts; `all`, these three. Apart from `all`: `threads`, one process
on 2 threads beside one thread, and `tokens`, the profiled model at other tokens a
micro-batch.

    python bench/sim_accuracy.py [--set in|out|split|threads|tokens|all] [--profile FILE] [--steps 10] [--rounds 3] [--link 200mbit] [--out bench/results/sim_accuracy.json]
    python bench/sim_accuracy.py --set out --paired --rounds 2   # a profile repeat before every run
    python bench/sim_accuracy.py --repredict RESULT.json --out FILE   # today's simulator on stored measurements

Where the profile's figures did not repeat, each row also has the step time with them at their
fastest and slowest repeat (`predicted_range`), and the table says how many measurements fell
within it. Per set the table also gives the signed error's median and spread (standard
deviation over the configurations): a median outside its spread is a bias, not noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.training.metrics import read_metrics
from ratrain.models.presets import get_preset
from ratrain.schedule.plan import build_plan
from ratrain.profiling.measure import LINK_SIZES
from ratrain.sim.profile import Link, LinkClass, from_dict, load_profile
from ratrain.sim.profile_repeats import at_edge, combine
from ratrain.sim.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402
from sim_accuracy_configs import MICRO, MODEL, SEQ, SETS, Config  # noqa: E402
from sim_accuracy_table import table  # noqa: E402
from two_nodes import LinkUnavailable, TwoNodes, parse_rate  # noqa: E402

WARMUP = 2  # a run's first steps, left out of its measured step time


def _config(c: Config, steps: int) -> RunConfig:
    cfg = RunConfig(model=get_preset(c.model))
    t = cfg.train
    t.seq_len, t.global_batch, t.micro_batch_size = c.seq, c.global_batch, c.micro
    t.steps, t.eval_batches, t.checkpoint_every, t.warmup_steps = steps, 0, 0, 0
    cfg.parallel.pp, cfg.parallel.dp = c.pp, c.dp
    cfg.parallel.threads_per_rank = c.threads  # as simulated, whatever the machine's cores
    return cfg


def _measure(cfg: RunConfig, plan, work: Path, link: TwoNodes | None,
             trace: bool = False) -> dict:
    """One `ratrain train --plan` run; `trace`: also its trace.json (the executor's last steps)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.save(work / "config.yaml")
    run_dir = work / "run"
    args = ["train", "--config", str(work / "config.yaml"), "--plan", str(work / "plan.json"),
            "--run-dir", str(run_dir), "--no-progress", "--trace" if trace else "--no-trace"]
    if link is None:
        threads = str(cfg.parallel.threads_per_rank or 1)  # one process: its threads
        proc = subprocess.run([sys.executable, "-m", "ratrain.cli", *args], capture_output=True,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": threads})
        if proc.returncode:
            raise SystemExit(proc.stderr.strip())
    else:
        link.run(cfg.parallel.pp * cfg.parallel.dp // 2, ["-m", "ratrain.cli", *args],
                 port=29611, log_dir=work)
    rows = read_metrics(run_dir / "metrics.jsonl")
    return {"step_time_s": statistics.median(r["step_time_s"] for r in rows[WARMUP:]),
            "ledger": rows[-1]["ledger_peak_bytes_per_rank"],
            "rss_growth": rows[-1].get("rss_growth_bytes_per_rank"),
            **({"trace": json.loads((run_dir / "trace.json").read_text())} if trace else {})}


def _measure_config(c: Config, cfg: RunConfig, work: Path, link: str,
                    trace: bool = False) -> dict:
    """`_measure` of a configuration's plan: as two nodes over a `link` (tc rate) where the
    configuration is linked (LinkUnavailable where no link can be made here)."""
    if not c.linked:
        return _measure(cfg, _plan(cfg, c), work, None, trace)
    with TwoNodes(link) as nodes:
        return _measure(cfg, _plan(cfg, c), work, nodes, trace)


def _over_link(profile, rate_bits: float, world: int):
    """Two nodes of world/2 ranks each, joined by a link of the tbf rate (latency: loopback's)."""
    link = Link(rate_bits / 8, profile.intra_node.p2p.latency)
    return dataclasses.replace(profile, devices_per_node=world // 2,
                               inter_node=LinkClass(p2p=link, collective=link))


def _profile_repeat(path: Path):
    """One repeat of `ratrain profile` on the profiled shape."""
    subprocess.run([sys.executable, "-m", "ratrain.cli", "profile", "--model", MODEL,
                    "--seq-len", str(SEQ), "--micro-batch-size", str(MICRO), "--repeats", "1",
                    "--out", str(path)], check=True, stdout=subprocess.DEVNULL)
    return load_profile(path)


def _plan(cfg: RunConfig, c: Config):
    p = cfg.parallel
    return build_plan(cfg.model.n_layers, p.pp, p.dp, cfg.n_micro, policy=c.policy,
                      activation=list(c.activation) if p.pp > 1 else c.activation[0],
                      units_per_stage=list(c.units_per_stage) if c.units_per_stage else None,
                      shard_state=c.shard_state, view_window=0 if c.shard_state else None,
                      schedule=c.schedule, weight_grad=c.weight_grad)


def _per_stage(per_rank: list, pp: int, dp: int) -> list:
    """The largest of each stage's replicas (ranks in the pp-dp order)."""
    return [max(per_rank[s * dp + r] for r in range(dp)) for s in range(pp)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a profile YAML; default: measure one with `ratrain profile`")
    ap.add_argument("--steps", type=int, default=10,
                    help=f"steps a run trains; the first {WARMUP} are not measured")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--link", default="200mbit", help="tc rate of the two-node link")
    ap.add_argument("--set", choices=SETS, default="all",
                    help="in: the profiled shape; out: shapes the profile did not measure; "
                         "split: split backwards beside 1F1B; threads: one process on 2 "
                         "threads; tokens: the profiled model at other tokens a micro-batch")
    ap.add_argument("--only", action="append",
                    help="a configuration's label to run (repeat for more; labels hold commas)")
    ap.add_argument("--paired", action="store_true",
                    help="a profile repeat right before every run, each run predicted from its own "
                         "(on a VM whose speed moves by a quarter within minutes)")
    ap.add_argument("--repredict", metavar="RESULT",
                    help="run nothing: predict a stored result's measurements again with today's "
                         "simulator (from its profile repeats)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/sim_accuracy.json"))
    args = ap.parse_args()
    refuse_too_few_steps(ap, args.steps)
    if args.repredict:
        result = json.loads(Path(args.repredict).read_text())
        repeats = [from_dict(d) for d in result.get("profile_repeats") or [result["profile"]]]
        profile = _merged(repeats)
        by_label = {c.label: c for configs in SETS.values() for c in configs}
        for row in result["rows"]:
            c = by_label[row["config"]]
            _merge(row, _predicted(c, row["link"] or args.link, profile, repeats[0],
                                   row.get("profile_per_round")))
        result["profile"] = profile.to_dict()
        result["repredicted"] = time.strftime("%Y-%m-%d")
    else:
        configs = [c for c in SETS[args.set] if not args.only or c.label in args.only]
        unknown = sorted(set(args.only or ()) - {c.label for c in SETS[args.set]})
        if unknown:
            ap.error(f"--only: no configuration {', '.join(map(repr, unknown))} in --set "
                     f"{args.set}")
        with tempfile.TemporaryDirectory() as tmp:
            runs, repeats = _measure_all(configs, args, Path(tmp))
        profile = _merged(repeats)
        rows = []
        for c in configs:
            if runs[c.label]:
                row = _row(c, runs[c.label], args.link)
                rows.append(_merge(row, _predicted(c, args.link, profile, repeats[0],
                                                   row.get("profile_per_round"))))
        result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:],
                  "profile": profile.to_dict(),
                  "profile_repeats": [p.to_dict() for p in repeats] if len(repeats) > 1 else None,
                  "profiled": {"model": MODEL, "seq_len": SEQ, "micro_batch_size": MICRO},
                  "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))


def refuse_too_few_steps(ap: argparse.ArgumentParser, steps: int) -> None:
    """--steps must leave a step after the warmup: with fewer, every run trained and the
    script failed at its end (no median of no steps)."""
    if steps <= WARMUP:
        ap.error(f"--steps {steps}: at least {WARMUP + 1} (the first {WARMUP} steps of a run "
                 "warm up and are not measured)")


def _merged(repeats: list):
    """One profile from the repeats, as `ratrain profile` merges its own."""
    return combine(repeats, LINK_SIZES) if len(repeats) > 1 else repeats[0]


def _measure_all(configs: list[Config], args, tmp: Path) -> tuple[dict[str, list[dict]], list]:
    """Every configuration once per round, and the profile's repeats (without --profile: one
    before each round and one after the last; --paired: one before every run, kept with it)."""
    repeats = [] if args.profile is None else [load_profile(args.profile)]
    runs: dict[str, list[dict]] = {c.label: [] for c in configs}
    own = args.paired and args.profile is None
    for r in range(args.rounds):  # alternate the order: a shared machine's drift hits all
        if args.profile is None and not own:
            repeats.append(_profile_repeat(tmp / f"profile-{r}.yaml"))
        for c in (configs if r % 2 == 0 else configs[::-1]):
            cfg = _config(c, args.steps)
            work = tmp / f"{c.label.replace(' ', '_').replace(',', '_')}-{r}"
            if own:
                repeats.append(_profile_repeat(tmp / f"profile-{r}-{len(repeats)}.yaml"))
            try:
                runs[c.label].append(_measure_config(c, cfg, work, args.link))
            except LinkUnavailable as e:
                print(f"{c.label}: skipped, no two-node link here ({e})", file=sys.stderr)
                continue
            if own:
                runs[c.label][-1]["profile"] = repeats[-1].to_dict()
            print(f"round {r + 1}: {c.label}: {runs[c.label][-1]['step_time_s']:.3f} s",
                  file=sys.stderr, flush=True)
    if args.profile is None and not own:
        repeats.append(_profile_repeat(tmp / "profile-last.yaml"))
    return runs, repeats


def _row(c: Config, got: list[dict], link: str) -> dict:
    """A configuration and what its rounds measured."""
    cfg = _config(c, 1)
    ledger = _per_stage(got[0]["ledger"], c.pp, c.dp)
    rss = ([statistics.median(_per_stage(g["rss_growth"], c.pp, c.dp)[s] for g in got)
            for s in range(c.pp)] if got[0]["rss_growth"] else None)
    return {
        "config": c.label, "pp": c.pp, "dp": c.dp, "n_micro": cfg.n_micro, "policy": c.policy,
        "activation": list(c.activation), "link": link if c.linked else None,
        "model": c.model, "seq_len": c.seq, "micro_batch_size": c.micro,
        "units_per_stage": c.units_per_stage, "shard_state": c.shard_state,
        "schedule": c.schedule, "weight_grad": c.weight_grad, "threads": c.threads,
        "in_sample": (c.model, c.seq, c.micro) == (MODEL, SEQ, MICRO),
        "step_time_s": {"measured": statistics.median(g["step_time_s"] for g in got),
                        "measured_per_round": [g["step_time_s"] for g in got]},
        "ledger_bytes": {"measured": ledger,
                         "same_every_round": all(g["ledger"] == got[0]["ledger"] for g in got)},
        "rss_growth_bytes": {"measured": rss},
        **({"profile_per_round": [g["profile"] for g in got]} if "profile" in got[0] else {}),
    }


def _merge(row: dict, predicted: dict) -> dict:
    """The row with the predictions beside its measurements (one level into each part)."""
    for key, value in predicted.items():
        if isinstance(value, dict):
            row.setdefault(key, {}).update(value)
        else:
            row[key] = value
    return row


def _simulated(c: Config, link: str, profile) -> tuple:
    """(the simulation of a configuration's plan, the profile it ran on: over `link` where the
    configuration is linked)."""
    cfg = _config(c, 1)
    used = _over_link(profile, parse_rate(link), c.pp * c.dp) if c.linked else profile
    return simulate(_plan(cfg, c), cfg.model, used, micro_batch_size=c.micro,
                    seq_len=c.seq, threads_per_rank=c.threads), used


def _predicted(c: Config, link: str, profile, first_repeat, paired: list | None = None) -> dict:
    """What the simulator predicts for a configuration: from the merged profile (and at the
    edges of its figures that did not repeat), from the first repeat alone, and with
    `paired` (a profile per round, plain data) each round from its own. Merged into the row's
    measured parts by key."""
    def step_s(p) -> float:
        return _simulated(c, link, p)[0].step_time

    sim, used = _simulated(c, link, profile)
    step = {"predicted": sim.step_time,
            "predicted_from_first_repeat": step_s(first_repeat)}
    if profile.unstable:
        step["predicted_range"] = [step_s(at_edge(profile, e))
                                   for e in ("fast", "slow")]
    if paired:
        step["predicted_per_round"] = [step_s(from_dict(p)) for p in paired]
    return {"step_time_s": step, "ledger_bytes": {"predicted": [r.peak for r in sim.ranks]},
            "rss_growth_bytes": {"predicted": [r.rss_growth(used.device) for r in sim.ranks]},
            "predicted_bubble": sim.bubble}


if __name__ == "__main__":
    main()
