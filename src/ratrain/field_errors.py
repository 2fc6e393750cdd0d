"""Refusals of config values that carry the fields they refuse, so that the flags which gave
those values lead the message (config.RunConfig.take_flag) by the field, not by its wording: a
user who typed --outer-lr is told `--outer-lr: train.outer_lr must be positive`."""

from __future__ import annotations

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
    """`error` led by the flags (by key) that gave the values it refuses, except those it says
    already; as it is where no flag gave them, or it refuses no field (a model's values)."""
    said = str(error)
    fields = error.fields if isinstance(error, FieldError) else ()
    typed = [flag for key, flag in flags.items() if key in fields and flag not in said]
    return UserError(f"{', '.join(typed)}: {said}") if typed else error
