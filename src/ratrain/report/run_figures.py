"""The run's figures for the report: summary.json's where the run wrote one (at its end), else
computed from metrics.jsonl (a run stopped by Ctrl-C, a crash or a divergence), each with the
words for what it is of."""

from __future__ import annotations

from dataclasses import dataclass


def grid(run):
    from ratrain.schedule.grid import RankGrid

    p = run.plan if run.plan is not None else run.cfg.parallel
    return RankGrid(p.pp, p.dp, p.rank_order)


def latest(rows: list[dict], key: str):
    """The latest row's `key` among those that have it (a row has its per-rank peaks only
    where they moved: training/loop.Loop._per_rank); None where none does."""
    return next((row[key] for row in reversed(rows) if key in row), None)


def stopped(run) -> str | None:
    """Where an unfinished run stopped, in words; None for a run that finished."""
    if run.summary:
        return None
    return f"the run stopped at step {run.metrics[-1]['step']} of {run.cfg.train.steps}"


def timed_rows(run) -> list[dict]:
    """The rows the means are of: all but each part's first (the run's, and a resume's), which
    pays for warm-up (all of them where there is one)."""
    rows = [r for r in run.metrics[1:] if not r.get("resumed")]
    return rows or run.metrics


def steps_text(rows: list[dict]) -> str:
    first, last = rows[0]["step"], rows[-1]["step"]
    return f"step {first}" if first == last else f"steps {first}-{last}"


def tokens_per_s(run) -> tuple[float | None, str]:
    """(the steps' tokens over the time they took, not a mean of their rates; what it is of)."""
    if run.summary.get("tokens_per_s") is not None:
        steps = run.summary.get("tokens_per_s_of_steps")
        return run.summary["tokens_per_s"], over_their_time(f"steps {steps}" if steps else
                                                            "the steps after the first")
    from ratrain.training.whole_run import Throughput

    counted = Throughput(run.metrics)  # as summary.json counts them
    if counted.tokens_per_s() is not None:
        return (counted.tokens_per_s(),
                f"{over_their_time(f'steps {counted.of_steps()}')}, {stopped(run)}")
    row = next((r for r in run.metrics if r.get("step_time_s") and r.get("tokens_per_s")), None)
    if row is None:
        return None, "no step recorded its time"
    return row["tokens_per_s"], f"step {row['step']}'s, {stopped(run)}"  # the run's only one


def over_their_time(steps: str) -> str:
    return f"tokens of {steps} over their time"


@dataclass
class Mfu:
    mfu: float | None
    peak_flops: float | None = None
    flops_per_token: float | None = None
    source: str | None = None  # where the peak comes from


def mfu(run) -> Mfu:
    """The MFU of the run's tokens/s (tokens_per_s); above 100%, none (below_peak)."""
    return below_peak(counted_mfu(run))


def counted_mfu(run) -> Mfu:
    """The MFU of the run's tokens/s. Without a summary, from metrics.jsonl's per-step MFU:
    each row's is its tokens/s times the same FLOPs per token over the same peak."""
    s = run.summary
    if s:
        return Mfu(s.get("mfu"), s.get("peak_flops"), s.get("flops_per_token"),
                   s.get("peak_flops_source"))
    from ratrain.training.mfu import flops_per_token

    tps = tokens_per_s(run)[0]
    row = next((r for r in reversed(run.metrics) if r.get("mfu") and r.get("tokens_per_s")), None)
    if row is None or tps is None:
        return Mfu(None, source="metrics.jsonl has no MFU: the run knew no peak")
    per_token = flops_per_token(run.cfg.model, run.cfg.train.seq_len)
    return Mfu(tps * row["mfu"] / row["tokens_per_s"],
               per_token * row["tokens_per_s"] / row["mfu"], per_token,
               "the peak metrics.jsonl's MFU is of")


def below_peak(m: Mfu) -> Mfu:
    """`m`, or where it is above 100% (no run does more than its peak) no MFU and why: the
    page shows the MFU, the peak and the source, so the source names the low peak."""
    if m.mfu is None or m.mfu <= 1:
        return m
    from ratrain.training.mfu import peak_low

    return Mfu(None, None, m.flops_per_token,
               f"{peak_low(m.mfu, m.peak_flops, m.source)}; {m.source or 'of unknown source'}")


def per_stage(run, name: str) -> list[float] | None:
    """Per stage, the largest of its replicas' `name` (ledger_peak_bytes, rss_growth_bytes)."""
    if f"{name}_per_stage" in run.summary:
        return run.summary[f"{name}_per_stage"]
    per_rank = latest(run.metrics, f"{name}_per_rank")
    return grid(run).largest_per_stage(per_rank) if per_rank else None


def process_peak(run) -> float | None:
    if run.summary.get("peak_memory_bytes") is not None:
        return run.summary["peak_memory_bytes"]
    peaks = [r["peak_memory_bytes"] for r in run.metrics if r.get("peak_memory_bytes") is not None]
    return max(peaks, default=None)


def validation(run) -> tuple[float, int] | None:
    """(the latest validation loss, the step it was measured after)."""
    row = next((r for r in reversed(run.metrics) if r.get("val_loss") is not None), None)
    return (row["val_loss"], row["step"]) if row else None
