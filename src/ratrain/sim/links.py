"""Links in the alpha-beta model: moving n bytes over a link takes its latency plus n over its
bandwidth; a ring collective over n ranks takes its steps' worth of both. Hardware profiles
(sim/profile.py) describe their links so; the cost model (sim/cost_model.py) and the planner
price transfers and collectives with them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Link:
    """An alpha-beta link: moving n bytes takes latency + n / bandwidth."""

    bandwidth: float
    latency: float = 0.0

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass
class LinkClass:
    """Links of one reach (within a node, or between nodes). `collective` is the per-link
    bandwidth and per-hop latency a ring all-reduce achieves (it may differ from point to point:
    a collective library's protocol, or a NIC shared by more ranks)."""

    p2p: Link
    collective: Link


def ring(link: Link, nbytes: float, n: int) -> float:
    """Ring all-reduce of `nbytes` over n ranks: 2(n-1) steps of nbytes/n each."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def ring_half(link: Link, nbytes: float, n: int) -> float:
    """Ring reduce-scatter, or all-gather, of `nbytes` (the whole) over n ranks: n-1 steps of
    nbytes/n each (half an all-reduce)."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency
