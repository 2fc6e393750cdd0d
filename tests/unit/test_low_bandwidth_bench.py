"""bench/low_bandwidth.py's arithmetic on small inputs (no namespaces, no training): each
step's bytes from the veth counter samples, and the table's ratio and loss gap."""

from __future__ import annotations

import pytest

from ratrain.errors import UserError

from .bench_loader import load_bench

bench = load_bench("low_bandwidth")
report = load_bench("low_bandwidth_report")


def test_each_step_gets_the_bytes_sent_until_its_row_appeared():
    # (seconds, tx node A, tx node B, rows in metrics.jsonl)
    samples = [(0.0, 100, 200, 0), (0.5, 150, 260, 0), (1.0, 400, 500, 1), (1.5, 410, 505, 1),
               (2.0, 420, 510, 2), (2.6, 1420, 1510, 4)]
    when, sent = bench.per_step(samples, 4)
    assert when == [1.0, 2.0, 2.6, 2.6]  # two rows between samples: both at the later one
    assert sent == [600, 30, 2000, 0]
    assert bench.per_step(samples, 6)[0] == when  # rows not yet seen: no step


def _run(sync, rate, tps, loss, val):
    steps = len(loss)
    return {"rate": rate, "pp": 1, "sync": sync, "steps": steps, "tokens_per_s": tps,
            "loss": loss, "val_loss": {str(steps): val}, "bytes_at_step": [9, 4, 6],
            "wall_s": 1.0}


def test_the_table_compares_with_the_synchronous_run_of_the_same_link_and_steps():
    sync = _run("step", "100mbit", 100.0, [3.0, 2.0, 2.0], 2.0)
    diloco = _run("diloco:50", "100mbit", 300.0, [3.0, 2.1, 2.1], 2.2)
    slow = _run("diloco:50", "50mbit", 250.0, [3.0, 2.1, 2.1], 2.2)
    rows = {(r["run"]["rate"], r["run"]["sync"]): r for r in report.rows([slow, diloco, sync])}
    r = rows["100mbit", "diloco:50"]
    assert r["speedup"] == 3.0 and r["mb_per_step"] == 5e-6 and r["peak_mb"] == 6e-6
    assert abs(r["gap"] - (7.2 / 3) / (7.0 / 3) + 1) < 1e-12
    assert abs(r["val_gap"] - 0.1) < 1e-12
    # no synchronous run at 50 Mbit/s: no ratio; the loss gap is against the same steps' sync
    assert rows["50mbit", "diloco:50"]["speedup"] is None and "gap" in rows["50mbit", "diloco:50"]
    assert "| 100mbit | 1 | diloco:50  | 3 | 300 | **3.00** |" in report.table(list(rows.values()))


def test_the_wall_rate_counts_rows_from_when_they_appeared():
    # (seconds, tx A, tx B, rows): step 1 at 1.0 s, then rows written five at a time
    samples = [(0.0, 0, 0, 0), (1.0, 0, 0, 1), (2.0, 0, 0, 5), (3.0, 0, 0, 5), (4.0, 0, 0, 10)]
    assert bench.steps_per_s(samples) == 9 / 3.0


def test_a_link_takes_a_rate_and_a_one_way_delay():
    two_nodes = load_bench("two_nodes")
    assert two_nodes.parse_link("200mbit") == ("200mbit", 0.0)
    assert two_nodes.parse_link("200mbit+25ms") == ("200mbit", 0.025)
    for bad in ("200mbit+25", "200mbit+x ms", "fast+25ms"):
        with pytest.raises(UserError):
            two_nodes.parse_link(bad)
