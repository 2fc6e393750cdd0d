"""What a run's report page and MFU figures must hold, for the report tests and the default
run's."""

from __future__ import annotations

import json
import re

import pytest

from ratrain.training.metrics import read_metrics


def check_page(report_dir, pictures: set[str]) -> str:
    """The page exists and shows every picture in the directory, each of them there."""
    html = (report_dir / "index.html").read_text()
    written = {p.name for p in report_dir.glob("*.png")}
    assert written == pictures
    shown = set(re.findall(r'<img src="([^"]+)"', html))
    assert shown == written
    for name in written:
        assert (report_dir / name).stat().st_size > 5000  # a picture, not an empty canvas
    assert "<script" not in html
    return html


def check_mfu(run_dir) -> None:
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert all(0 < r["mfu"] < 2 for r in rows)
    assert 0 < summary["mfu"] < 2 and summary["peak_flops"] > 0
    assert summary["mfu"] == pytest.approx(
        summary["flops_per_token"] * summary["tokens_per_s"] / summary["peak_flops"])
