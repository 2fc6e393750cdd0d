"""bench/schedules.py's command line: the layouts, the model and batch, the rounds, and the
implementations beyond ratrain, the baseline and torch's pipelining."""

from __future__ import annotations

import argparse
from pathlib import Path

from ratrain.errors import UserError
from ratrain.schedule.weight_grads import CAPPED, WEIGHT_GRADS, parse_placement

from schedules_implementations import PEER_ZB, ZERO_BUBBLE
from schedules_layout import ORDERS

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "schedules.json"
DEFAULT_CONFIGS = "1x2,2x2:pp-dp,2x2:dp-pp"


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help=f"comma-separated PPxDP[:ORDER] layouts, run one after the other "
                         f"(default: {DEFAULT_CONFIGS})")
    ap.add_argument("--pp", type=int, help="one layout instead of --configs: pipeline stages")
    ap.add_argument("--dp", type=int, help="one layout instead of --configs: data-parallel replicas")
    ap.add_argument("--rank-order", choices=ORDERS, default="pp-dp",
                    help="rank order of --pp/--dp, and of --configs items without one "
                         "(pp-dp: a stage's replicas are neighbouring ranks, dp-pp: a replica's "
                         "stages are; under torchrun neighbours share a node)")
    ap.add_argument("--link", metavar="RATE",
                    help="run as two nodes over a veth pair shaped to RATE with tbf (tc units: "
                         "200mbit, 1gbit, 25mbps); needs root")
    ap.add_argument("--model", default="tiny", help="model preset (default: tiny)")
    ap.add_argument("--layers", type=int,
                    help="decoder blocks instead of the preset's (more, smaller units: a finer "
                         "grain for per-unit gradient sync)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int,
                    help="sequences per micro-batch (default: global batch / (dp x pp), i.e. pp "
                         "micro-batches per replica)")
    ap.add_argument("--global-batch", type=int, default=16,
                    help="sequences per optimizer step over all replicas (default 16)")
    ap.add_argument("--clip", type=float, default=1.0,
                    help="max global gradient norm on all three (default 1.0, as training; 0: off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per implementation per round")
    ap.add_argument("--rounds", type=int, default=12,
                    help="rounds; each runs --steps steps of every implementation (default 12)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per implementation first")
    ap.add_argument("--peer-sync", choices=("ddp", "allreduce"), default="ddp",
                    help="pp > 1 peer: stage modules wrapped in DDP (default) or one all_reduce "
                         "after the schedule")
    ap.add_argument("--ddp-bucket-mb", type=float, default=25.0,
                    help="DDP bucket_cap_mb of the peer (default 25, DDP's own default)")
    ap.add_argument("--ratrain-policy", choices=("ratrain", "baseline"), default="ratrain",
                    help="policy of the 'ratrain' row (baseline: an A/A run of the harness)")
    ap.add_argument("--auto", action="store_true",
                    help="one more implementation, auto: policy ratrain with --schedule auto, the "
                         "plan of ratrain train's default flags")
    ap.add_argument("--split", type=_placements, default=[], metavar="PLACEMENTS",
                    help=f"comma-separated weight-gradient placements ({', '.join(WEIGHT_GRADS)}, {CAPPED}): "
                         f"one more implementation zbh1-PLACEMENT each, policy ratrain with "
                         f"schedule zbh1 (default: none)")
    ap.add_argument("--groups", type=_groups, default=[], metavar="G[,G]",
                    help="one more implementation 1f1b-gG each: policy ratrain, 1F1B in "
                         "unit-major groups of G micro-batches (--micro-batch-group G)")
    ap.add_argument("--peer-zb", action="store_true",
                    help=f"pp > 1: one more peer, {PEER_ZB}: torch's {ZERO_BUBBLE} with one stage "
                         f"per rank, replicas averaged by all_reduce")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)  # a rank under torchrun
    return ap


def _groups(text: str) -> list[int]:
    try:
        out = [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected group sizes such as 2,4") from None
    if any(g < 2 for g in out) or len(set(out)) < len(out):
        raise argparse.ArgumentTypeError(f"{text!r}: give each group size (>= 2) once")
    return out


def _placements(text: str) -> list[str]:
    out = [w.strip() for w in text.split(",")]
    try:
        for w in out:
            parse_placement(w)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if len(set(out)) < len(out):
        raise argparse.ArgumentTypeError(f"{text!r}: give each placement once")
    return out
