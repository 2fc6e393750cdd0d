"""A profile whose links are the ones a run measured at its start (runtime/link_probe.py): each
timed all-reduce and send fitted to the alpha-beta model (sim/links.py), each link put in its
class by whether its ranks share a node, and a class's measured links replacing the base
profile's figures (the slowest of a class where several were measured: the plan waits for
it). What no link of a class measured stays the base profile's. Pure Python."""

from __future__ import annotations

import dataclasses

from ratrain.schedule.grid import RankGrid
from ratrain.sim.links import Link, LinkClass
from ratrain.sim.profile import HardwareProfile


def fit(sizes: list[int], seconds: list[float], factor: float = 1.0,
        hops: float = 1.0) -> Link:
    """Least squares of t = hops * latency + factor * n / bandwidth over the sizes n (a ring
    all-reduce over k ranks: factor 2(k-1)/k, hops 2(k-1)); latency at least 0."""
    xs = [factor * n for n in sizes]
    k = len(xs)
    mx, my = sum(xs) / k, sum(seconds) / k
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, seconds)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    if intercept < 0 or slope <= 0:  # noise past the model: through the origin instead
        intercept = 0.0
        slope = sum(x * y for x, y in zip(xs, seconds)) / sum(x * x for x in xs)
    return Link(bandwidth=1.0 / slope, latency=intercept / hops)


def _slowest(links: list[Link], base: Link) -> Link:
    if not links:
        return base
    return Link(min(x.bandwidth for x in links), max(x.latency for x in links))


def measured_profile(base: HardwareProfile, grid: RankGrid, devices_per_node: int, sizes,
                     rings: list[list[float]], hops: list[list[float]]
                     ) -> tuple[HardwareProfile, str]:
    """`base` with the links of `rings` (per stage: its replicas' all-reduce, seconds per
    size) and `hops` (per hop s -> s + 1: one send) in their classes, nodes of
    `devices_per_node` consecutive ranks; and what was measured, in words."""
    def crosses(ranks) -> bool:
        return len({r // devices_per_node for r in ranks}) > 1

    got = {False: ([], []), True: ([], [])}  # crosses nodes: (sends, all-reduces)
    for s, times in enumerate(rings):
        ranks = grid.replica_ranks(s)
        k = len(ranks)
        got[crosses(ranks)][1].append(fit(sizes, times, 2 * (k - 1) / k, 2 * (k - 1)))
    for s, times in enumerate(hops):  # replica 0's hop stands for all (the same rank order)
        got[crosses([grid.rank(s, 0), grid.rank(s + 1, 0)])][0].append(fit(sizes, times))
    classes, words = {}, []
    for inter, name in ((False, "within a node"), (True, "between nodes")):
        cls = base.inter_node if inter else base.intra_node
        sends, reduces = got[inter]
        classes[inter] = LinkClass(_slowest(sends, cls.p2p), _slowest(reduces, cls.collective))
        kinds = [f"{kind} {_rate(link)}" for kind, link, seen in (
            ("all-reduce", classes[inter].collective, reduces),
            ("send", classes[inter].p2p, sends)) if seen]
        if kinds:
            words.append(f"{name}: " + ", ".join(kinds))
    profile = dataclasses.replace(
        base, name=f"{base.name} + measured links", devices_per_node=devices_per_node,
        intra_node=classes[False], inter_node=classes[True])
    return profile, "; ".join(words)


def _rate(link: Link) -> str:
    bits = 8 * link.bandwidth
    rate = f"{bits / 1e9:.3g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.3g} Mbit/s"
    return f"{rate} ({link.latency * 1e3:.2g} ms latency)"
