"""Checks of values read from YAML and JSON files, shared by the run-config and hardware-profile
loaders. Each returns the value as its type or raises ValueError saying what was expected and
what came; the loaders put the key's path in front."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import yaml


def number(value: Any, whole: bool = False, from_string: bool = True) -> int | float:
    """`value` as a finite number (an int where `whole`). YAML 1.1 reads 3e-3 or 4.0e10 (no dot,
    or no sign in the exponent) as a string, so a numeric string is taken where `from_string`."""
    if from_string and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {shown(value)}")
    # NaN passes every range check after this one, and int(inf) overflows
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {shown(value)}")
    if whole and value != int(value):
        raise ValueError(f"expected a whole number, got {shown(value)}")
    return int(value) if whole else float(value)


def unknown_keys(data: dict, known) -> list[str]:
    """Keys of `data` not in `known`, as sorted text (a file may mix keys of several types)."""
    return sorted(map(str, set(data) - set(known)))


def with_close_matches(unknown: list[str], known) -> str:
    """The unknown keys, comma-separated, each followed by the known key it likely misspells
    ("warmup_step (did you mean warmup_steps?)"), where one is close."""
    import difflib

    known = [str(k) for k in known]
    return ", ".join(key + "".join(f" (did you mean {m}?)" for m in
                                   difflib.get_close_matches(key, known, n=1))
                     for key in unknown)


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


def typed_dataclass(factory, values: dict[str, Any], section: str):
    """The dataclass `factory` made of the mapping `values` (section `section` of a file), each
    value checked against its field's type; ValueError names the first that is not."""
    fields = {f.name: f for f in dataclasses.fields(factory)}
    unknown = unknown_keys(values, fields)
    if unknown:
        raise ValueError(f"unknown key(s) in config section '{section}': "
                         f"{with_close_matches(unknown, fields)}")
    return factory(**{key: typed_value(fields[key].type, value, f"{section}.{key}")
                      for key, value in values.items()})


def typed_value(annotation: str, value: Any, path: str) -> Any:
    """`value` as the field's type (annotations are strings here: `from __future__`), or a
    ValueError. A float field takes a numeric string (YAML 1.1 reads 3e-3 as one)."""
    optional = annotation.endswith("| None")
    kind = annotation.removesuffix("| None").strip()
    if value is None and optional:
        return None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ValueError(f"{path}: expected true or false, got {shown(value)}")
    if kind in ("int", "float"):
        try:
            return number(value, whole=kind == "int", from_string=kind == "float")
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ValueError(f"{path}: expected a string, got {shown(value)}")
    if kind == "list[int]":
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        raise ValueError(f"{path}: expected a list of whole numbers, got {shown(value)}")
    raise TypeError(f"config field {path} has a type the loader does not know: {annotation}")
