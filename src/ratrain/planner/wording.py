"""Small pieces of the planner's English that several messages share."""

from __future__ import annotations

SPELLED_WITH_A_VOWEL = set("fhlmnrsx")
"""Consonant letters whose names start with a vowel sound ("ef", "aitch", "em"): a name that
begins with one and is read letter by letter (mt3000, h100) takes "an"."""


def a_device(name: str) -> str:
    """"a cpu-local device", "an mt3000 device", "an h100 device": the article by how the
    profile's name is read, a word (cpu-local, measured-vm) or letters (mt3000: no vowel follows
    its first letter)."""
    first, second = (name.lower() + "  ")[:2]
    read_as_letters = first in SPELLED_WITH_A_VOWEL and second not in "aeiouy"
    article = "an" if first in "aeiou" or read_as_letters else "a"
    return f"{article} {name} device"


THIS_MACHINES_MEMORY = "this machine's available memory"
"""How a profile's note on device.memory_bytes begins where that memory is this machine's, not
the profile's (`ratrain plan` and `train --memory-budget` without --profile:
cli/plan_search.with_this_machines_memory)."""


def memory_is_this_machines(profile) -> bool:
    """Whether the profile's device memory is this machine's, put in place of its own."""
    return profile.notes.get("device.memory_bytes", "").startswith(THIS_MACHINES_MEMORY)


def profile_said(profile) -> str:
    """The profile as a plan's heading names it: "cpu-local", or "cpu-local with this
    machine's memory" where that replaced the preset's (the two searched different memory,
    and both headings said "on cpu-local")."""
    if memory_is_this_machines(profile):
        return f"{profile.name} with this machine's memory"
    return profile.name


def share_of_budget(held: float, limit: float) -> str:
    """`held` bytes against the budget's `limit`: "38% of the budget" up to ten budgets,
    "14,063x the budget" past them (a 1 KB budget read "1406297% of the budget")."""
    share = held / limit
    if share < 10:
        return f"{share:.0%} of the budget"
    return f"{share:,.0f}x the budget"
