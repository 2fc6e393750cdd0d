"""A refusal of a value a flag gave names that flag by the field it refuses, not by its words:
as the flag where the message names the field's key, the key beside it (`--seq-len
(train.seq_len) must be positive`, since 2026-12-03), else leading the message (until
2026-12-03 a regex looked for the field's name in the message: `state home must be one of ...`
never named --state-home, and a value spelled like another field, --schedule lr, named --lr as
well)."""

from __future__ import annotations

import pytest

from ratrain.config import RunConfig
from ratrain.errors import UserError

# (flag, section, field, a value it refuses): one for every kind of refusal of the sections
REFUSED = [
    ("--val-fraction", "data", "val_fraction", 1.0),
    ("--lr", "train", "lr", float("nan")),
    ("--seq-len", "train", "seq_len", 0),
    ("--eval-every", "train", "eval_every", -1),
    ("--outer-momentum", "train", "outer_momentum", 1.5),
    ("--global-batch", "train", "global_batch", 7),
    ("--dtype", "train", "dtype", "float8"),
    ("--checkpoint-dir", "train", "checkpoint_dir", " "),
    ("--seq-len", "train", "seq_len", 10 ** 6),  # past the model's max_seq_len
    ("--pp", "parallel", "pp", 0),
    ("--comm-timeout", "parallel", "comm_timeout_s", 0.0),
    ("--threads", "parallel", "threads_per_rank", 0),
    ("--policy", "parallel", "policy", "fast"),
    ("--rank-order", "parallel", "rank_order", "rows"),
    ("--schedule", "parallel", "schedule", "round-robin"),
    ("--weight-grad", "parallel", "weight_grad", "sideways"),
    ("--activation", "parallel", "activation", "forget"),
    ("--micro-batch-group", "parallel", "micro_batch_group", 0),
    ("--device-units", "parallel", "device_units", -1),
    ("--view-window", "parallel", "view_window", -1),
    ("--host-grad-dtype", "parallel", "host_grad_dtype", "int8"),
    ("--grad-lifetime", "parallel", "grad_lifetime", "forever"),
    ("--sync", "parallel", "sync", "sometimes"),
    ("--state-home", "parallel", "state_home", "attic"),
    ("--update", "parallel", "update", "later"),
]


def _refusal(cfg: RunConfig) -> str:
    with pytest.raises(UserError) as info:
        cfg.validate()
    return str(info.value)


@pytest.mark.parametrize("flag,section,name,value", REFUSED)
def test_every_refusal_of_a_flags_value_names_the_flag(flag, section, name, value):
    from_file = RunConfig()  # the same value from a config file: the message alone
    setattr(getattr(from_file, section), name, value)
    said = _refusal(from_file)
    typed = RunConfig()
    typed.take_flag(flag, section, name, value)
    key = f"{section}.{name}"
    if flag in said:  # worded with its flag already: not led by it again
        assert _refusal(typed) == said
    elif f"{key} {value} " in said:  # the key and its value: said as the flag, the key beside
        assert _refusal(typed) == said.replace(f"{key} {value}", f"{flag} {value} ({key})", 1)
    elif key in said:
        assert _refusal(typed) == said.replace(key, f"{flag} ({key})", 1)
    else:  # a message that does not name its key
        assert _refusal(typed) == f"{flag}: {said}"


def test_a_value_spelled_like_another_field_leads_only_with_its_own_flag():
    cfg = RunConfig()
    cfg.take_flag("--lr", "train", "lr", 0.01)
    cfg.take_flag("--schedule", "parallel", "schedule", "lr")
    assert _refusal(cfg) == ("--schedule: unknown schedule 'lr'; available: auto, 1f1b, gpipe, "
                             "zbh1")


def test_a_refusal_of_two_fields_names_the_flags_that_gave_them_only():
    cfg = RunConfig()
    cfg.take_flag("--micro-batch-size", "train", "micro_batch_size", 3)
    cfg.take_flag("--steps", "train", "steps", 5)  # a field it does not refuse
    assert _refusal(cfg) == ("train.global_batch 8 is not a multiple of --micro-batch-size 3 "
                             "(train.micro_batch_size)")
