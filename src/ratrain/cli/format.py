"""Plain-text output: counts, tables, a prediction's range. Byte sizes: ratrain.byte_units,
the one formatter every layer prints them with."""

from __future__ import annotations


def fmt_count(n: int) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def table(rows: list[list], header: list[str]) -> str:
    """Plain-text table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def range_line(edges: tuple[float, float], figures: list[str]) -> str:
    """A step time at a profile's fast and slow edges (profile_repeats.step_time_range)."""
    fast, slow = edges
    shown = ", ".join(figures[:3]) + (f" and {len(figures) - 3} more" if len(figures) > 3 else "")
    if f"{fast:.4g}" == f"{slow:.4g}":
        return (f"{fast:.4g} s at either repeat of the profile's figures that did not repeat "
                f"({shown}): they do not move it")
    return (f"{fast:.4g}-{slow:.4g} s with the profile's figures that did not repeat at their "
            f"fastest and slowest repeat ({shown})")


def other_work_line(hw) -> str | None:
    """The note that other work ran while the profile was measured (its times then read
    that work's load as the machine's slowness, sim/profile_repeats.py), for the command
    line: it was in the YAML alone, and a prediction twice too slow came without a word."""
    note = hw.notes.get("other_work")
    return f"profile {hw.name}: {note}" if note else None
