"""Refusals of config values that carry the fields they refuse, so that the flags which gave
those values lead the message (config.RunConfig.take_flag) by the field, not by its wording: a
user who typed --outer-lr is told `--outer-lr (train.outer_lr) must be positive`."""

from __future__ import annotations

import re

from ratrain.errors import UserError
from ratrain.model_config import check_finite


class FieldError(UserError):
    """A config value refused: `fields` are the keys ("train.lr") of the values it is about."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


def check_finite_field(key: str, value: float | None) -> None:
    """model_config.check_finite's refusal, carrying `key`."""
    try:
        check_finite(key, value)
    except UserError as e:
        raise FieldError(str(e), key) from None


def led_by_flags(error: UserError, flags: dict[str, str]) -> UserError:
    """`error` worded by the flags (by key) that gave the values it refuses: a key it names is
    said as the flag, the key beside it for a config file's reader (`--global-batch
    (train.global_batch) must be positive`; `--global-batch 6 (train.global_batch) is not a
    multiple of ...`); a flag whose key it does not name leads it, unless the message says the
    flag already. As it is where no flag gave them, or it refuses no field (a model's values)."""
    said = str(error)
    fields = error.fields if isinstance(error, FieldError) else ()
    lead = []
    for key, flag in flags.items():
        if key not in fields or f"({key})" in said:  # said beside its flag already
            continue
        named = re.compile(rf"(?<![\w.]){re.escape(key)}( -?\d+(?:\.\d+)?)?(?![\w.])")
        if named.search(said):
            said = named.sub(lambda m: f"{flag}{m.group(1) or ''} ({key})", said, count=1)
        elif flag not in said:
            lead.append(flag)
    if said == str(error) and not lead:
        return error
    return UserError(f"{', '.join(lead)}: {said}" if lead else said)
