"""Repeated measurements of one machine made into one profile: the median of every figure, and
the figures that did not repeat.

A figure repeats when its spread over the repeats, (max - min) / median, is at most TOLERANCE,
taken over what the figure does to a prediction:
- a time, a rate or a size: the figure itself;
- a link: the time it predicts for each size it was measured at (from one fit to the next,
  latency and bandwidth trade off against each other; the simulator only uses their sum);
- contention: the slowdown it applies, 1 + contention;
- a compute rate: its peak, and the rates it achieves (peak x efficiency, and attention's),
  which are what price the shapes the profile did not measure. Each repeat derives its
  efficiencies from its own peak, so peak and efficiency move against each other (on this
  2-core VM: peaks 45-87 GFLOP/s, efficiencies 1.12-0.56, for achieved rates within 16%); a
  merged efficiency is the median achieved rate over the median peak, not the median
  efficiency, whose product with another repeat's peak priced every unmeasured shape 13% slow
  (2026-11-23).

A figure that does not repeat is named in the profile's notes (`stability`) with its values,
and its median is used, contention's as every other's: what is not measured well widens the
range a prediction states, it does not bias the prediction. The profile keeps such a figure's
slowest and fastest repeat (`unstable`), so a prediction can say how far it leans on what did
not repeat: at_edge gives the profile at either edge, and `ratrain simulate` and `ratrain plan`
the step time at both. (Until 2026-11-26 an unstable contention was set to 0, not applied: a
profile of the 2-core VM whose contention repeated as 0.188, 0.345 and 0.183 then priced every
multi-process step as if compute did not slow with every core busy, and the range it stated
began at 0.183, above the 0 it applied.)

A repeat measured while other work kept the cores busy (other_work.py) reads that work's load as
the machine's slowness; where a quieter repeat exists it is set aside. Where none does, the
figures are what there is: the median is used and the notes say why. Contention, which such work
inflates by an amount that cannot be told, then has a range whatever its repeats did: from 0 (a
quiet machine's floor) to its largest repeat.

Pure Python over plain data (HardwareProfile.to_dict): the measuring itself is profiling.py's.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from ratrain.counts import counted
from ratrain.errors import UserError
from ratrain.sim.links import Link
from ratrain.sim.profile import HardwareProfile, from_dict

RATE = "peak_flops"  # the key of a ComputeRate as plain data
TOLERANCE = 0.10
BUSY = 0.25  # cores of other work beside a measurement that disturb it
CONTENTION = "device.contention"
# the other_work note's words where every repeat was beside other work (mfu.py reads them)
LOADED = "the times are slower than on a quiet machine"


def spread(values: list[float]) -> float:
    """(max - min) / median; 0 where every value is 0."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else float(max(values) != min(values))


def figures(profile: dict[str, Any], sizes: list[float]) -> dict[str, list[float]]:
    """Every figure of a profile (as plain data) by its path, as the quantities its stability is
    judged by: one number, or a link's predicted times at `sizes`."""
    out: dict[str, list[float]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if set(node) == {"bandwidth", "latency"}:
                link = Link(node["bandwidth"], node["latency"])
                out[path] = [link.time(n) for n in sizes]
                return
            if RATE in node:
                out[f"{path}.peak_flops"] = [float(node["peak_flops"])]
                if node.get("efficiency") is not None:  # None: not measured (a peak alone)
                    out[f"{path}.achieved"] = [_achieved(node, "efficiency")]
                if node.get("attention_efficiency") is not None:
                    out[f"{path}.attention_achieved"] = [_achieved(node, "attention_efficiency")]
                return
            for key, value in node.items():
                if key not in ("notes", "description", "name", "unstable"):
                    walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            out[path] = [1.0 + node if path == CONTENTION else float(node)]

    walk(profile, "")
    return out


def unstable(repeats: list[dict[str, Any]], sizes: list[float],
             tolerance: float = TOLERANCE) -> dict[str, float]:
    """The figures whose spread over `repeats` (plain-data profiles) exceeds `tolerance`: path
    -> spread (a link's: its largest over the sizes)."""
    per_repeat = [figures(r, sizes) for r in repeats]
    worst = {}
    for path, first in per_repeat[0].items():
        s = max(spread([f[path][i] for f in per_repeat]) for i in range(len(first)))
        if s > tolerance:
            worst[path] = s
    return worst


def combine(repeats: list[HardwareProfile], sizes: list[float], tolerance: float = TOLERANCE,
            other_work: list[float] | None = None) -> HardwareProfile:
    """One profile from repeated measurements: the median of every number (of a link: the
    repeat whose predicted times are the median ones, or the mean of the middle two's times,
    so latency and bandwidth stay one line), the figures that did not repeat named in its
    notes and kept at their slowest and fastest repeat (`unstable`); every figure, contention
    included, at its median.

    `other_work`: per repeat, the cores other work kept busy while it measured (other_work.py).
    Repeats measured beside more than BUSY cores of other work are set aside where a quieter
    one exists; where none does, contention (which such work inflates) is kept at its median
    with a range from 0 to its largest repeat."""
    other_work = other_work or [0.0] * len(repeats)
    quiet = [r for r, busy in zip(repeats, other_work) if busy <= BUSY]
    used = quiet or repeats
    data = [{k: v for k, v in r.to_dict().items() if k not in ("unstable", "notes")}
            for r in used]
    merged = _median(data, sizes)
    bad = unstable(data, sizes, tolerance) if len(used) > 1 else {}
    # a link shown by its time at the largest size
    values = {path: [f[path][-1] for f in (figures(d, sizes) for d in data)] for path in bad}
    notes = _notes([r.notes for r in used])
    notes["stability"] = _stability_note(len(used), bad, values, tolerance, len(repeats))
    merged["unstable"] = _edges(data, bad, merged, sizes)
    largest = max(float(d["device"]["contention"]) for d in data)
    if not quiet and largest > 0:  # beside other work: from a quiet machine's 0 to its largest
        _widen(merged["unstable"], CONTENTION, slow=largest, fast=0.0)
    if len(quiet) < len(repeats):
        shown = ", ".join(f"{busy:.2f}" for busy in other_work)
        during = ("the measuring" if len(repeats) == 1
                  else f"the {len(repeats)} repeats")
        if quiet:
            aside = len(repeats) - len(quiet)
            notes["other_work"] = (f"other work kept {shown} cores busy during {during}: the "
                                   f"{counted(aside, 'repeat')} beside more than {BUSY} cores of "
                                   f"it {'is' if aside == 1 else 'are'} set aside")
        else:
            c = merged["device"]["contention"]
            used_as = (f"its {c:.3g} is used, its range from 0 to that" if len(repeats) == 1
                       else f"its median {c:.3g} is used, its range from 0 to its largest repeat")
            notes["other_work"] = (f"other work kept {shown} cores busy during {during}: "
                                   f"{LOADED}, and contention cannot be told from that work's "
                                   f"load: {used_as} (unstable)")
    merged["notes"] = notes
    return from_dict(merged, "combined profile")


# Figures that price memory, not time: no edge of theirs moves a step time.
_NOT_TIME = ("memory_bytes", "process_overhead_bytes", "process_overhead_per_byte")


def _edges(data: list[dict[str, Any]], bad: dict[str, float], merged: dict[str, Any],
           sizes: list[float]) -> dict[str, dict[str, float]]:
    """Each unstable figure that prices time, as the fields of its slowest and of its fastest
    repeat: {"slow": {field path: value}, "fast": {...}}. A rate's edges are its achieved
    rates over the merged peak; a link's, its repeats' envelope (the least bandwidth with the
    most latency, and the other way round), slower or faster than every repeat at every size
    (until 2026-12-02 the repeat whose times summed over the measured sizes were longest or
    shortest: where one repeat's fit had more latency and more bandwidth, the "slow" one was
    the faster at the GB-sized copies of a 7B plan, and the step time at the slow edge came
    out below the median's); any other figure's, its largest and smallest value, the slow edge being the
    larger of a time or the contention and the smaller of a bandwidth."""
    slow: dict[str, float] = {}
    fast: dict[str, float] = {}
    for path in bad:
        if path.endswith(_NOT_TIME) or path.endswith(".peak_flops"):
            continue  # a peak prices nothing alone: its rates are judged as achieved
        if path.endswith("achieved"):
            rate_path, key = path.rsplit(".", 1)
            field = "efficiency" if key == "achieved" else "attention_efficiency"
            peak = _get(merged, rate_path)["peak_flops"]
            rates = [_achieved(_get(d, rate_path), field) for d in data]
            slow[f"{rate_path}.{field}"] = min(rates) / peak
            fast[f"{rate_path}.{field}"] = max(rates) / peak
            continue
        values = [_get(d, path) for d in data]
        if isinstance(values[0], dict):  # a link: its envelope (below)
            bandwidths, latencies = [v["bandwidth"] for v in values], [v["latency"] for v in values]
            slow[f"{path}.bandwidth"], slow[f"{path}.latency"] = min(bandwidths), max(latencies)
            fast[f"{path}.bandwidth"], fast[f"{path}.latency"] = max(bandwidths), min(latencies)
            continue
        larger_is_slower = not path.endswith(("bandwidth", "flops", "efficiency"))
        slow[path], fast[path] = ((max(values), min(values)) if larger_is_slower
                                  else (min(values), max(values)))
    return {"slow": slow, "fast": fast} if slow else {}


def _widen(edges: dict[str, dict[str, float]], path: str, slow: float, fast: float) -> None:
    """Put a figure's edges into `unstable` (its "slow" and "fast" parts), at least as wide as
    any already there."""
    edges.setdefault("slow", {})
    edges.setdefault("fast", {})
    edges["slow"][path] = max(slow, edges["slow"].get(path, slow))
    edges["fast"][path] = min(fast, edges["fast"].get(path, fast))


def at_edge(profile: HardwareProfile, edge: str) -> HardwareProfile:
    """The profile with every figure that did not repeat at its "slow" or "fast" repeat."""
    data = profile.to_dict()
    for path, value in data["unstable"].get(edge, {}).items():
        try:
            parent, key = path.rsplit(".", 1)
            node = _get(data, parent)
            if key not in node:
                raise KeyError(key)
        except (KeyError, IndexError, TypeError, ValueError):  # a profile edited by hand
            raise UserError(f"profile {profile.name}: unstable.{edge}: {path!r} is no figure "
                            f"of the profile") from None
        node[key] = _beyond_the_median(edge, key, node, value)
    data["unstable"] = {}
    return from_dict(data, f"{profile.name} at its {edge} edge")


def _beyond_the_median(edge: str, key: str, node: dict, value: float) -> float:
    """A link's edge no faster (slow) or slower (fast) than its median at any size: profiles
    combined before 2026-12-02 kept a link's edge as one repeat's fit, which could cross the
    median's (more bandwidth and more latency); taken with the median's, the edge brackets it
    at every size (with two repeats, as the envelope of both would)."""
    if set(node) != {"bandwidth", "latency"}:
        return value
    pick = min if (key == "bandwidth") == (edge == "slow") else max
    return pick(value, node[key])


def step_time_range(profile: HardwareProfile,
                    step_time: Callable[[HardwareProfile], float]) -> tuple[float, float] | None:
    """What `step_time` (a prediction on a profile) gives with the figures that did not repeat
    at their fastest and at their slowest repeat; None where every figure repeated."""
    if not profile.unstable:
        return None
    return step_time(at_edge(profile, "fast")), step_time(at_edge(profile, "slow"))


def unstable_figures(profile: HardwareProfile) -> list[str]:
    """The paths of the figures that did not repeat."""
    return sorted(profile.unstable.get("slow", {}))


def _get(data: Any, path: str) -> Any:
    """The node of plain data at a figure's path ("device.contention", "measured[0].block")."""
    for part in path.split("."):
        name, _, index = part.partition("[")
        data = data[name]
        if index:
            data = data[int(index.rstrip("]"))]
    return data


def _notes(per_repeat: list[dict[str, str]]) -> dict[str, str]:
    """Every repeat's notes; one that only some repeats wrote (a figure fits.py bounded in
    them) says in how many."""
    notes: dict[str, str] = {}
    for repeat in per_repeat:
        for key, text in repeat.items():
            notes.setdefault(key, text)
    for key in notes:
        wrote = sum(key in repeat for repeat in per_repeat)
        if wrote < len(per_repeat):
            notes[key] = f"in {wrote} of {len(per_repeat)} repeats: {notes[key]}"
    return notes


def _median(data: list[Any], sizes: list[float]) -> Any:
    """The median of each number. Of an even count, the mean of the two middle values: until
    2026-12-02 the lower one, which put every figure of two repeats at one repeat's, the
    fastest unit times and the slowest bandwidths."""
    first = data[0]
    if isinstance(first, dict):
        if set(first) == {"bandwidth", "latency"}:
            def total(d: dict) -> float:
                return sum(Link(d["bandwidth"], d["latency"]).time(n) for n in sizes)
            middle = sorted(data, key=total)[(len(data) - 1) // 2:len(data) // 2 + 1]
            return middle[0] if len(middle) == 1 else _mean_link(middle)
        if RATE in first:
            peak = statistics.median([d["peak_flops"] for d in data])
            return {key: (peak if key == RATE else None if any(d.get(key) is None for d in data)
                          else statistics.median([_achieved(d, key) for d in data]) / peak)
                    for key in first}
        return {k: _median([d[k] for d in data], sizes) for k in first}
    if isinstance(first, list):
        return [_median([d[i] for d in data], sizes) for i in range(len(first))]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        if all(isinstance(d, int) for d in data):  # a count (cores, a shape's sizes): whole
            return statistics.median_low(data)
        return statistics.median(data)
    return first


def _mean_link(links: list[dict[str, float]]) -> dict[str, float]:
    """The link whose time at every size is the mean of theirs: latency and bandwidth stay one
    line, as a fit's do, where a median of each apart would not."""
    seconds_per_byte = statistics.mean(1 / d["bandwidth"] for d in links)
    return {"bandwidth": 1 / seconds_per_byte,
            "latency": statistics.mean(d["latency"] for d in links)}


def _achieved(rate: dict[str, float], efficiency: str) -> float:
    """FLOP/s achieved at one of a rate's efficiencies."""
    return float(rate["peak_flops"] * rate[efficiency])


def _stability_note(n: int, bad: dict[str, float], values: dict[str, list[float]],
                    tolerance: float, taken: int | None = None) -> str:
    """`n` repeats kept of `taken` (a lone one kept of several was said "measured once")."""
    if n < 2 and (taken or n) > n:
        return (f"{n} of {taken} repeats kept ({taken - n} set aside beside other work): "
                "stability not checked; rerun on a quieter machine or with more --repeats")
    if n < 2:
        return "measured once: stability not checked (ratrain profile --repeats N)"
    if not bad:
        return f"{n} repeats: every figure within {tolerance:.0%} of its median"
    parts = []
    for path, s in bad.items():
        shown = ", ".join(f"{v - 1:.3g}" if path == CONTENTION else f"{v:.3g}"
                          for v in values[path])
        parts.append(f"{path} spread {s:.0%} ({shown}): the median is used; predictions that "
                     f"lean on it carry its spread")
    return f"{n} repeats; did not repeat within {tolerance:.0%}: " + "; ".join(parts)
