"""Byte sizes as ratrain prints them: in decimal units, as budgets are written (20GB), so that
a size said beside a budget reads in the budget's units. Every command, table and message uses
this one formatter (planner/budget.py still parses both GB and GiB); it sits at the package's
root so that every layer may use it."""

from __future__ import annotations


def decimal_bytes(n: float) -> str:
    """Bytes in decimal units: 80.86 GB, 60.00 MB, 12.3 kB, 42 B."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1e3:.1f} kB" if abs(n) >= 100 else f"{n:.0f} B"
