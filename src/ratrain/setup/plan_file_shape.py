"""A plan file's shape, checked as it is read (setup/plan_file.read_plan_file): each key of
its type, the layout's counts in agreement, or a UserError naming the file and the key's path.
A hand edit once met the readers' guesses instead: "pp": "two" was refused as "--partition
3,3 gives 2 stages' units for 1 stages" (a flag not given), "programs": null as "TypeError:
'NoneType' object is not iterable", a dp of 2 as "n_micro=2 (run has 1)"."""

from __future__ import annotations

import json
from typing import Any, Callable

from ratrain.errors import UserError
from ratrain.schedule.plan import RANK_ORDERS, SCHEDULES, STATE_HOMES
from ratrain.schedule.plan_rules import GRAD_LIFETIMES, HOST_GRAD_DTYPES, UPDATES
from ratrain.schedule.policies import POLICIES

REMAKE = "make a new plan with `ratrain plan --out`"


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v: Any) -> bool:
    return _whole(v) and v >= 1


def _count(v: Any) -> bool:
    return _whole(v) and v >= 0


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


def _units(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(map(_count, v)) and v[0] < v[1]


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(map(_text, v))


def _or_none(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _one_of(names) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in tuple(names), "one of " + ", ".join(names))


POSITIVE = (_positive, "a positive integer")
COUNT = (_count, "a whole number (0 or more)")
TEXT = (_text, "a string")
FLAG = (_flag, "true or false")
OBJECT = (lambda v: isinstance(v, dict), "an object")
LIST = (lambda v: isinstance(v, list), "a list")

PLAN_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "pp": POSITIVE, "dp": POSITIVE, "n_micro": POSITIVE, "stage_units": LIST, "programs": LIST,
    "policy": _one_of(POLICIES), "schedule": _one_of(SCHEDULES),
    "activation": (lambda v: _text(v) or isinstance(v, list),
                   "a string, or a list of each stage's list of strings"),
    "clip": FLAG, "rank_order": _one_of(RANK_ORDERS),
    "view_window": (_or_none(_count), "null or " + COUNT[1]), "state_home": _one_of(STATE_HOMES),
    "shard_state": FLAG, "weight_grad": (_or_none(_text), "null or a string"),
    "grad_lifetime": _one_of(GRAD_LIFETIMES),
    "shard_group": (_or_none(_positive), "null or a positive integer"),
    "micro_batch_group": POSITIVE, "sync": TEXT, "update": _one_of(UPDATES), "device_units": LIST,
    "tie_embeddings": FLAG, "device_grad_sum": FLAG, "host_grad_dtype": _one_of(HOST_GRAD_DTYPES),
    "run": OBJECT, "model_preset": TEXT, "prediction": OBJECT}
"""Each key plan_json.plan_to_dict and planner/plan_file.to_dict write, and what it must be.
Keys of neither are left alone; RunConfig.from_dict holds "run" to its own keys."""

REQUIRED = ("pp", "dp", "n_micro", "stage_units", "programs", "policy", "schedule", "activation",
            "clip")
"""The keys every plan has had: plan_json.plan_from_dict reads the others' absence as their
default (older plans, or a field at its default); "run" is in every `ratrain plan --out` file,
but not in a plan build_plan made."""

ELEMENTS = {"stage_units": (_units, "a [start, stop] pair of unit numbers, start < stop"),
            "programs": (_text, "a stage's program text (a string)"),
            "activation": (_texts, "a list of strings"),
            "device_units": COUNT, "run.parallel.partition": POSITIVE}
"""What each element of a list-valued key must be."""

RUN_KEYS = {"model": {"name": TEXT, "vocab_size": POSITIVE, "dim": POSITIVE,
                      "n_layers": POSITIVE, "n_heads": POSITIVE},
            "train": {"seq_len": POSITIVE, "global_batch": POSITIVE,
                      "micro_batch_size": POSITIVE, "dtype": TEXT},
            "parallel": {"pp": POSITIVE, "dp": POSITIVE, "partition": LIST}}
"""The keys of "run" that every `ratrain plan --out` has written, and that `train --plan` takes
(one missing was a default taken in silence: the model "custom", refused as not the preset)."""
RUN_OPTIONAL = {"parallel": {"threads_per_rank": (_or_none(_positive),
                                                 "null or a positive integer")}}
"""The keys of "run" that `ratrain plan --out` writes only where given (--threads), checked
where present (a 0 was refused as the flag's, the file unnamed)."""


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(where: str, path: str, value: Any, check: Callable[[Any], bool], what: str) -> None:
    if not check(value):
        raise UserError(f'{where}: "{path}" must be {what}, got {_shown(value)}')


def _check_keys(where: str, data: dict, prefix: str, keys: dict, required=None) -> None:
    """Each of `keys` in `data` (at `prefix`), checked; one absent refused where `required`
    (default: all) holds it."""
    for key, (check, what) in keys.items():
        if key not in data:
            if required is None or key in required:
                raise UserError(f'{where}: "{prefix}{key}" is missing (it must be {what}); '
                                f"{REMAKE}")
            continue
        path = prefix + key
        _check(where, path, data[key], check, what)
        for i, item in enumerate(data[key] if path in ELEMENTS else ()):
            _check(where, f"{path}[{i}]", item, *ELEMENTS[path])


def check_plan_shape(data: dict, where: str) -> None:
    """Raise a UserError (naming `where`, the file, and the key) unless `data` has a plan's
    keys, each of its type, and counts that agree with each other."""
    _check_keys(where, data, "", PLAN_KEYS, REQUIRED)
    run = data.get("run")
    if run is not None:
        for section, keys in RUN_KEYS.items():
            _check_keys(where, run, "run.", {section: OBJECT})
            _check_keys(where, run[section], f"run.{section}.", keys)
            _check_keys(where, run[section], f"run.{section}.", RUN_OPTIONAL.get(section, {}),
                        required=())
    _check_agreement(data, where)


def _check_agreement(data: dict, where: str) -> None:
    pp, dp, n_micro = data["pp"], data["dp"], data["n_micro"]
    lists = [("stage_units", data["stage_units"]), ("programs", data["programs"])]
    if isinstance(data["activation"], list):
        lists.append(("activation", data["activation"]))
    run = data.get("run")
    if run is not None:
        lists.append(("run.parallel.partition", run["parallel"]["partition"]))
    for what, stages in lists:
        if len(stages) != pp:
            raise UserError(f"{where} is inconsistent: its pp is {pp}, but its {what} has "
                            f"{len(stages)} stages (edited by hand?); {REMAKE}")
    units = data["stage_units"]
    for s, (unit, before) in enumerate(zip(units, [[0, 0], *units])):
        if unit[0] != before[1]:  # (the stages' units are 0 .. n_layers + 1, in order)
            after = f", where stage {s - 1}'s units end" if s else ""
            raise UserError(f'{where}: "stage_units[{s}]" starts at unit {unit[0]}, not at '
                            f"{before[1]}{after}; {REMAKE}")
    if run is None:
        return
    train, parallel = run["train"], run["parallel"]
    mbs, batch = train["micro_batch_size"], train["global_batch"]
    if dp * n_micro * mbs != batch:
        raise UserError(f'{where}: "dp" ({dp}) x "n_micro" ({n_micro}) x '
                        f'"run.train.micro_batch_size" ({mbs}) is {dp * n_micro * mbs} sequences '
                        f'a step, but "run.train.global_batch" is {batch}: they must agree (each '
                        f"replica's programs run n_micro micro-batches); for another dp or batch, "
                        f"{REMAKE}")
    for key in ("pp", "dp"):
        if parallel[key] != data[key]:
            raise UserError(f'{where}: "run.parallel.{key}" is {parallel[key]}, but "{key}" is '
                            f"{data[key]}: the two must agree (edited by hand?); {REMAKE}")
    if parallel["partition"] != [stop - start for start, stop in units]:
        raise UserError(f'{where}: "run.parallel.partition" {_shown(parallel["partition"])} '
                        f'does not count the units of "stage_units" {_shown(units)}; {REMAKE}')
