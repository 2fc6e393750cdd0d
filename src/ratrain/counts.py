"""Counts as ratrain prints them, the noun agreeing with the number: "1 micro-batch", "2
micro-batches". It sits at the package's root, as byte_units.py does, so that every layer (the
pure planner and simulator too) may use it."""

from __future__ import annotations


def noun_for(n: int, singular: str, plural: str | None = None) -> str:
    """`singular` for one, else `plural` (default: `singular` + "s"); zero takes the plural."""
    return singular if n == 1 else plural or singular + "s"


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """The count and its noun: counted(1, "rank") is "1 rank", counted(3, "rank") "3 ranks"."""
    return f"{n} {noun_for(n, singular, plural)}"


def model_units(n_layers: int) -> str:
    """A model's schedulable units as refusals list them: "embedding, 4 decoder blocks, head"."""
    return f"embedding, {counted(n_layers, 'decoder block')}, head"
