"""A run's figures over all its parts. A resume starts a new process, which measures its memory
peaks and times its steps from nothing; what the run's rows and summary.json say of the whole
run takes the earlier parts from the rows metrics.jsonl kept (MetricsLog.kept)."""

from __future__ import annotations

# the rows' lists of each rank's memory peaks
PEAK_LISTS = ("peak_memory_bytes_per_rank", "ledger_peak_bytes_per_rank",
              "rss_growth_bytes_per_rank")


class RunPeaks:
    """The run's memory peaks so far: the larger of this process's and the earlier parts'.
    Across a resume that gave the ranks other jobs (another pp, dp or rank order; `carried`
    False) a rank's earlier peak is another job's: the peaks then count from the resume, and
    its first row says so (`memory_peaks_from_step`, kept in `from_step` by later resumes)."""

    def __init__(self, kept: list[dict], carried: bool, start: int):
        self.before: dict = {}
        if not carried:
            self.from_step = start + 1
            return
        self.from_step = next((r["memory_peaks_from_step"] for r in reversed(kept)
                               if "memory_peaks_from_step" in r), None)
        for key in PEAK_LISTS:  # the rows have them where they moved: the last is the peak
            self.before[key] = next((r[key] for r in reversed(kept) if r.get(key)), None)
        self.before["peak_memory_bytes"] = max(
            (r["peak_memory_bytes"] for r in kept if r.get("peak_memory_bytes") is not None),
            default=None)

    def of(self, key: str, now):
        """`now` (a list per rank, or the largest process's), with the earlier parts' peaks."""
        before = self.before.get(key)
        if now is None or before is None:
            return now
        if isinstance(now, list):
            return [max(a, b) for a, b in zip(now, before)]
        return max(now, before)


class Throughput:
    """The run's mean tokens/s: its steps' tokens over the time they took, every part's steps
    but its first, which pays for warm-up allocations (a mean of the steps' rates would weigh a
    slow step, a save's or a stall's, as little as a fast one)."""

    def __init__(self, kept: list[dict]):
        self.steps: list[int] = []
        self.tokens = self.seconds = 0.0
        for r in kept:
            if r["step"] > 1 and not r.get("resumed") and r.get("step_time_s") \
                    and r.get("tokens_per_s"):
                self.add(r["step"], r["tokens_per_s"] * r["step_time_s"], r["step_time_s"])

    def add(self, step: int, tokens: float, seconds: float) -> None:
        self.steps.append(step)
        self.tokens += tokens
        self.seconds += seconds

    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None

    def of_steps(self) -> str:
        """The steps counted, as ranges ("2-20, 22-30")."""
        ranges: list[list[int]] = []
        for s in self.steps:
            if ranges and s == ranges[-1][1] + 1:
                ranges[-1][1] = s
            else:
                ranges.append([s, s])
        return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
