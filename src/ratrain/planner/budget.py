"""Memory budgets as users write them: plain bytes, `20e9`, `20GB`, `18GiB`, `512 MiB`."""

from __future__ import annotations

import math
import re

from ratrain.errors import UserError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_FORM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | float | int, what: str = "--memory-budget") -> int:
    """Bytes from a number or a number with a decimal (GB) or binary (GiB) unit."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = _FORM.match(str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise UserError(f"{what}: expected bytes such as 20GB, 18GiB or 20e9, got {text!r}")
        value, unit = float(match.group(1)), match.group(2).lower()
    nbytes = value * _UNITS[unit]
    if not math.isfinite(nbytes):
        raise UserError(f"{what}: not a finite number of bytes, got {text!r}")
    if nbytes < 1:
        raise UserError(f"{what}: must be at least 1 byte, got {text!r}")
    return int(nbytes)
