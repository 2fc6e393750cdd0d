"""One convention for the byte sizes ratrain prints: decimal units, as budgets are written
(ratrain.byte_units). Until 2026-12-02 train's memory line, simulate's table, `models` and the
start-up memory check said MiB and GiB beside a planner, disk check and report that said MB and
GB: "367.6 MiB" of a "400 MB" budget read as within it."""

from __future__ import annotations

import re

from ratrain.byte_units import decimal_bytes

from .cli_runner import run_cli

# a size as printed: a number and a decimal unit, never a binary one
SIZE = re.compile(r"^\d+(\.\d+)? (B|kB|MB|GB|TB)$")


def test_sizes_are_said_in_decimal_units():
    assert [decimal_bytes(n) for n in (42, 12_345, 60e6, 80.86e9, 1.24e12)] == [
        "42 B", "12.3 kB", "60.00 MB", "80.86 GB", "1.24 TB"]


def test_the_planners_formatter_is_the_one_formatter():
    from ratrain.planner import account

    assert account.decimal_bytes is decimal_bytes


def test_trains_memory_line_says_decimal_units():
    from ratrain.cli.train_said import memory_line

    line = memory_line({"ledger_peak_bytes_per_stage": [367_600_000, 2_500_000_000],
                         "rss_growth_bytes_per_stage": [12_300_000, 400_000]})
    assert line == ("peak memory held (ledger): stage 0: 367.60 MB (RSS +12.30 MB), "
                    "stage 1: 2.50 GB (RSS +400.0 kB)")
    assert memory_line({"peak_memory_bytes": 90e6}) == "peak memory: 90.00 MB"


def _table_rows(out: str, header: str) -> tuple[list[str], list[list[str]]]:
    """The header line and the rows (cells split on runs of two spaces) of the table whose
    header starts with `header`."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 2:] if line[:1].isdigit()]
    return lines[start], rows


def test_simulates_table_and_schedule_line_say_decimal_units(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "--model", "tiny", "--pp", "2")
    assert code == 0, err
    assert "GiB" not in out and "MiB" not in out, out
    schedule = next(line for line in out.splitlines() if line.startswith("schedule "))
    assert re.search(r"its largest stage holds \d+\.\d\d MB .* of a 8\.00 GB budget", schedule)
    header, rows = _table_rows(out, "stage ")
    assert "fits 8.00 GB" in header  # cpu-local's 8 GB a device
    assert len(rows) == 2 and all(SIZE.match(row[3]) and SIZE.match(row[4]) for row in rows), out


def test_plans_table_and_models_table_say_decimal_units(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--devices", "2",
                             "--memory-budget", "1GB", "--top", "2")
    assert code == 0, err
    header, rows = _table_rows(out, "#  tokens/s")
    assert "peak / 1.00 GB" in header
    assert rows and all(SIZE.match(row[-2]) for row in rows), out
    code, out, _ = run_cli(monkeypatch, capsys, "models")
    llama7b = next(line for line in out.splitlines() if line.startswith("llama2-7b"))
    assert "13.48 GB" in llama7b and "121.29 GB" in llama7b  # bf16 weights, and with the state


def test_the_memory_check_says_decimal_units():
    from ratrain.config import RunConfig
    from ratrain.models.presets import get_preset
    from ratrain.schedule.plan import build_plan
    from ratrain.setup.memory_fit import StageBytes, memory_refusal

    cfg = RunConfig()
    cfg.model = get_preset("llama2-7b")
    kinds = {"optimizer": 60_000_000_000, "masters": 30_000_000_000, "activations": 10_000_000}
    stages = [StageBytes(90_010_000_000, 90_010_000_000, 0, kinds, kinds)]
    why = memory_refusal(cfg, build_plan(4, 1, 1, 4), stages, local_ranks=[0],
                         host_available=80e9, device_bytes=None, host_is_separate=False)
    assert ("its rank here would hold about 90.01 GB (optimizer 60.00 GB, masters 30.00 GB), "
            "80.00 GB is available") in why, why
