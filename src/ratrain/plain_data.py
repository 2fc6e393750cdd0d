"""Checks of values read from YAML and JSON files, shared by the run-config and hardware-profile
loaders. Each returns the value as its type or raises ValueError saying what was expected and
what came; the loaders put the key's path in front."""

from __future__ import annotations

from typing import Any

import yaml


def number(value: Any, whole: bool = False, from_string: bool = True) -> int | float:
    """`value` as a number (an int where `whole`). YAML 1.1 reads 3e-3 or 4.0e10 (no dot, or no
    sign in the exponent) as a string, so a numeric string is taken where `from_string`."""
    if from_string and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {shown(value)}")
    if whole and value != int(value):
        raise ValueError(f"expected a whole number, got {shown(value)}")
    return int(value) if whole else float(value)


def unknown_keys(data: dict, known) -> list[str]:
    """Keys of `data` not in `known`, as sorted text (a file may mix keys of several types)."""
    return sorted(map(str, set(data) - set(known)))


def shown(value: Any) -> str:
    """A value for an error line: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_error(e: Exception) -> str:
    """A parser's complaint in one line (YAML's span several, with a caret drawing)."""
    mark = getattr(e, "problem_mark", None)
    if isinstance(e, yaml.YAMLError) and mark is not None:
        return f"{getattr(e, 'problem', None) or 'invalid YAML'} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(e).split())
