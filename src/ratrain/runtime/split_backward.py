"""A unit's backward in two autograd calls: the input gradient (BI), then the weight gradients
(BW), without running the input-gradient chain twice.

The idea is torch.distributed.pipelining's (`stage_backward_input`/`stage_backward_weight`),
written for one unit's graph. In the graph from the unit's output back to its input, the
*seams* are the nodes on the input's path that also take something computed from a weight (a
matmul of the input and a weight, RMSNorm's product with its weight). BI runs autograd from
the output to the input only, keeping the graph (retain_graph), and a pre-hook on each seam
catches the gradient flowing into it: its `seeds`. Autograd runs only what the input needs, so
the seams' weight halves have not run. BW starts autograd at the seams with those seeds and
asks only for the weights' gradients: each seam's weight half, and the weight-only nodes
behind it (a NormHead's row normalization), run once, and nothing on the input's path runs
again. The seeds are what a split backward holds between its halves besides the activations
BW reads: the gradient of each weight-reading op's output. The other activations BI was the
last to read (`WeightGrad.nodes` says which nodes BW runs; the executor drops the rest).

Weights are found in the graph (every leaf that requires grad, except the input), not in the
module: a tied head reads the embedding's weight. Where one weight reaches several seams (a
weight used twice), those seams form one group and BW runs them in one call, each seam fed its
own seed and nothing else (a pre-hook replaces what flows into it from the other seams, which
BI has already counted).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node


def _node(t: torch.Tensor) -> Node | None:
    """The graph node of `t`: its grad_fn, or a leaf's gradient accumulator (made on demand)."""
    if t.grad_fn is not None:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0] if t.requires_grad else None


@dataclass
class _Group:
    seams: list[Node]
    weights: list[Node]  # AccumulateGrad nodes
    behind: set[Node] = field(default_factory=set)  # weight-only nodes between them and the seams
    seeds: dict[Node, tuple] = field(default_factory=dict)


@dataclass
class WeightGrad:
    """What BI leaves for BW: the seams grouped with their weights, and their seeds."""

    groups: list[_Group]

    def seed_tensors(self) -> list[torch.Tensor]:
        return [g for group in self.groups for seeds in group.seeds.values()
                for g in seeds if g is not None]

    def nodes(self) -> list[Node]:
        """The nodes BW runs: the seams and what lies behind them toward the weights. What
        the rest of the graph saved, BI was the last to read."""
        return [n for group in self.groups for n in (*group.seams, *group.behind)]


def _parents(root: Node) -> dict[Node, list[Node]]:
    """Each node of the graph under `root` -> the nodes that feed their gradient into it."""
    parents: dict[Node, list[Node]] = defaultdict(list)
    seen, queue = {root}, deque([root])
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return parents


def _upward(start: Node, parents: dict[Node, list[Node]], stop=frozenset()) -> tuple[set, set]:
    """The nodes reached from `start` toward the output, not crossing `stop`; and the nodes of
    `stop` met."""
    seen, met, queue = {start}, set(), deque([start])
    while queue:
        for parent in parents.get(queue.popleft(), ()):
            if parent in stop:
                met.add(parent)
            elif parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return seen, met


def _groups(root: Node, x_node: Node) -> list[_Group]:
    parents = _parents(root)
    on_path, _ = _upward(x_node, parents)  # nodes whose gradient reaches the input
    on_path = frozenset(on_path | {root})
    weights = [n for n in parents if n is not x_node and not n.next_functions
               and getattr(n, "variable", None) is not None]
    by_seam: dict[Node, _Group] = {}
    for w in weights:
        behind, seams = _upward(w, parents, on_path)
        joined = {id(by_seam[s]): by_seam[s] for s in seams if s in by_seam}
        group = _Group(list(seams), [w], behind)
        for other in joined.values():
            group.seams += [s for s in other.seams if s not in seams]
            group.weights += other.weights
            group.behind |= other.behind
        for s in group.seams:
            by_seam[s] = group
    return list({id(g): g for g in by_seam.values()}.values())


def backward_input(y: torch.Tensor, grad_y: torch.Tensor | None,
                   x: torch.Tensor) -> tuple[torch.Tensor, WeightGrad]:
    """The gradient of the unit's input `x` from its output `y` (with `grad_y`; None: y is the
    loss), and what BW needs to finish the weight gradients."""
    groups = _groups(_node(y), _node(x))
    handles = []
    for group in groups:
        for seam in group.seams:
            handles.append(seam.register_prehook(
                lambda grads, g=group, s=seam: g.seeds.__setitem__(s, grads)))
    try:
        (dx,) = torch.autograd.grad(y, x, grad_y, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return dx, WeightGrad(groups)


def backward_weight(wg: WeightGrad) -> None:
    """Accumulate the weights' gradients into their `.grad` (in place where there is one, as
    autograd's accumulation does), from what backward_input kept. Frees the graph's buffers."""
    for group in wg.groups:
        edges, seeds = [], []
        for seam in group.seams:
            for i, g in enumerate(group.seeds[seam]):
                if g is not None:
                    edges.append(GradientEdge(seam, i))
                    seeds.append(g)
        handles = [seam.register_prehook(lambda grads, s=group.seeds[seam]: s)
                   for seam in group.seams] if len(group.seams) > 1 else []
        try:
            grads = torch.autograd.grad(edges, [GradientEdge(w, 0) for w in group.weights],
                                        seeds, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        for w, g in zip(group.weights, grads):
            if g is None:
                continue
            p = w.variable
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
    wg.groups.clear()
