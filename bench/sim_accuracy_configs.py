"""bench/sim_accuracy.py's configurations: the shape `ratrain profile` measures (in sample),
shapes it did not (out of sample), and split backwards beside 1F1B on the same layouts."""

from __future__ import annotations

import dataclasses

MODEL, SEQ, MICRO = "tiny", 256, 2  # the shape `ratrain profile` measures


@dataclasses.dataclass(frozen=True)
class Config:
    label: str
    pp: int
    dp: int
    global_batch: int
    policy: str = "ratrain"
    activation: tuple[str, ...] = ("keep",)  # one per stage
    linked: bool = False  # two nodes over the rate-limited link
    model: str = MODEL
    seq: int = SEQ
    micro: int = MICRO
    units_per_stage: tuple[int, ...] | None = None
    shard_state: bool = False
    schedule: str = "1f1b"
    weight_grad: str | None = None  # a split schedule's BW placement
    threads: int = 1  # each rank's CPU threads (OMP_NUM_THREADS of a run in one process)


# The profiled shape: the simulator reads its measured unit times.
IN_SAMPLE = [
    Config("1x1 keep", 1, 1, 8),
    Config("2x1 keep", 2, 1, 8, activation=("keep",) * 2),
    Config("2x1 keep, 8 micro", 2, 1, 16, activation=("keep",) * 2),
    Config("2x1 baseline", 2, 1, 8, "baseline", ("keep",) * 2),
    Config("2x1 recompute", 2, 1, 8, activation=("recompute",) * 2),
    Config("2x1 recompute,keep", 2, 1, 8, activation=("recompute", "keep")),
    Config("1x2 ratrain", 1, 2, 8),
    Config("1x2 baseline", 1, 2, 8, "baseline"),
    Config("2x2 ratrain", 2, 2, 16, activation=("keep",) * 2),
    Config("4x1 keep", 4, 1, 8, activation=("keep",) * 4),
    Config("1x2 ratrain, link", 1, 2, 8, linked=True),
    Config("1x2 baseline, link", 1, 2, 8, "baseline", linked=True),
]
# Shapes the profile did not measure (other presets, sequence lengths, micro-batch sizes): the
# simulator prices them from FLOPs and the profile's rates.
OUT_OF_SAMPLE = [
    Config("small 1x1 s128 mb1", 1, 1, 4, model="small", seq=128, micro=1),
    Config("small 2x1 s128 mb1 recompute,keep", 2, 1, 8, activation=("recompute", "keep"),
           model="small", seq=128, micro=1),
    Config("small 2x1 s64 mb4 baseline", 2, 1, 16, "baseline", ("keep",) * 2, model="small",
           seq=64, micro=4),
    Config("tiny 3x1 s512 mb1 uneven 1,3,2", 3, 1, 6, activation=("keep",) * 3, seq=512,
           micro=1, units_per_stage=(1, 3, 2)),
    Config("tiny 4x1 s512 mb1 recompute", 4, 1, 8, activation=("recompute",) * 4, seq=512,
           micro=1),
    Config("tiny 2x2 s128 mb4 sharded", 2, 2, 32, activation=("keep",) * 2, seq=128, micro=4,
           shard_state=True),
    Config("tiny-gqa 1x2 s384 mb2 sharded", 1, 2, 8, model="tiny-gqa", seq=384,
           shard_state=True),
    Config("small 1x2 s128 mb2 ratrain, link", 1, 2, 8, linked=True, model="small", seq=128),
]
# Split backwards (BI, BW) beside 1F1B on the same layouts: the zero-bubble schedule where the
# pipeline idles (pp=2 on 2 cores), and grouped weight gradients where a slow link's sync waits
# for the last backward (pp=1 dp=2 over the link: tiny's gradient sync there takes about as long
# as its backward).
SPLIT = [
    Config("small 2x1 4 micro 1f1b", 2, 1, 4, activation=("keep",) * 2, model="small", micro=1),
    Config("small 2x1 4 micro zbh1", 2, 1, 4, activation=("keep",) * 2, model="small", micro=1,
           schedule="zbh1"),
    Config("small 2x1 8 micro 1f1b", 2, 1, 8, activation=("keep",) * 2, model="small", micro=1),
    Config("small 2x1 8 micro zbh1", 2, 1, 8, activation=("keep",) * 2, model="small", micro=1,
           schedule="zbh1"),
    Config("1x2 zbh1 grouped, link", 1, 2, 8, linked=True, schedule="zbh1", weight_grad="grouped"),
    Config("1x2 4 micro baseline, link", 1, 2, 16, "baseline", linked=True),
    Config("1x2 4 micro ratrain, link", 1, 2, 16, linked=True),
    Config("1x2 4 micro zbh1 grouped, link", 1, 2, 16, linked=True, schedule="zbh1",
           weight_grad="grouped"),
]
# One process on both cores (torch's default), which the profile's one-thread times are
# scaled for (sim/shared_cores.py), beside the same on one thread.
THREADS = [
    Config("small 1x1 s128 mb1", 1, 1, 4, model="small", seq=128, micro=1),
    Config("small 1x1 s128 mb1, 2 threads", 1, 1, 4, model="small", seq=128, micro=1,
           threads=2),
    Config("tiny 1x1 s512 mb1 recompute, 2 threads", 1, 1, 4, activation=("recompute",),
           seq=512, micro=1, threads=2),
    Config("tiny-gqa 1x1 s384 mb2, 2 threads", 1, 1, 8, model="tiny-gqa", seq=384, threads=2),
]
# The profiled model at other tokens a micro-batch, 8 micro-batches of a 2-stage pipeline: the
# profile measures its shape (512 tokens) and one of a quarter (128), and prices the rest
# between and beyond them (sim/shape_scale.py).
TOKENS = [
    Config(f"tiny 2x1 s{seq} mb{micro}", 2, 1, 8 * micro, activation=("keep",) * 2, seq=seq,
           micro=micro)
    for seq, micro in ((64, 1), (128, 1), (128, 2), (256, 4), (512, 4))
]
SETS = {"in": IN_SAMPLE, "out": OUT_OF_SAMPLE, "split": SPLIT, "threads": THREADS,
        "tokens": TOKENS,
        "all": IN_SAMPLE + OUT_OF_SAMPLE + SPLIT}
