"""A step's row of metrics.jsonl (which the main rank writes), from what every rank said of
the step (training/step_meetings.StepFigures): the loss over the replicas (--sync diloco: each
replica's and island's too), the memory peaks of the run so far, and each rank's lists of them
where they moved."""

from __future__ import annotations

from ratrain.schedule.grid import RankGrid
from ratrain.training.step_meetings import StepFigures, replicas_mean
from ratrain.training.whole_run import RunPeaks


class StepRows:
    """The rows of one run's steps, on its engine and rank grid, with its peaks (RunPeaks)."""

    def __init__(self, engine, grid: RankGrid, peaks: RunPeaks):
        self.engine, self.grid, self.peaks = engine, grid, peaks
        self._written: dict[str, list] = {}  # _per_rank's last lists by key

    def row(self, row: dict, figures: list[StepFigures], final: bool) -> dict:
        """This rank's row of a step with what every rank said of it."""
        row["loss"] = replicas_mean([f.loss for f in figures])
        if self.engine.outer is not None:  # each replica's own, on its own weights
            firsts = [figures[r] for r in self.grid.replica_ranks(0)]
            row["loss_per_replica"] = [f.loss for f in firsts]
            islands = self.engine.outer.sync.islands
            if islands:  # how far the islands drift apart: an island's replicas share weights
                size = len(firsts) // islands
                row["loss_per_island"] = [replicas_mean(row["loss_per_replica"][i:i + size])
                                          for i in range(0, len(firsts), size)]
            if firsts[0].loss_scale is not None:  # float16: each replica scales its own
                row["loss_scale_per_replica"] = [f.loss_scale for f in firsts]
                row["skipped_per_replica"] = [f.skipped for f in firsts]
                row["skipped"] = any(f.skipped for f in firsts)
        row["peak_memory_bytes"] = self.peaks.of("peak_memory_bytes",
                                                 max(f.peak_memory for f in figures))
        ledger = [f.ledger_peak for f in figures]
        growth = [f.rss_growth for f in figures]
        lists = {
            "peak_memory_bytes_per_rank": ([f.peak_memory for f in figures]
                                           if len(figures) > 1 else None),
            "ledger_peak_bytes_per_rank": ledger if ledger[0] is not None else None,
            "rss_growth_bytes_per_rank": growth if growth[0] is not None
            and self.engine.stage.device.type == "cpu" else None}
        self._per_rank(row, {k: self.peaks.of(k, v) for k, v in lists.items()}, final)
        return row

    def _per_rank(self, row: dict, lists: dict, final: bool) -> None:
        """Each rank's peaks into the row where they moved since the last row that has them,
        and in the run's last: they only grow (the run's so far: RunPeaks), and most steps'
        are the last ones' (a row of 1,024 ranks' three lists is ~40 KB; every step's made
        metrics.jsonl grow by that). What reads them reads the latest row that has them."""
        for key, values in lists.items():
            if values is not None and (final or list(values) != self._written.get(key)):
                row[key] = self._written[key] = list(values)
