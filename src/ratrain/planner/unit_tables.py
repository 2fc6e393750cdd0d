"""The unit tables of a search's layouts (planner/unit_table.py), made once per shape, lifecycle
and device group and shared by every layout that has them, with the per-layout bounds the
search and the partition bounds read from them."""

from __future__ import annotations

from ratrain.planner.bounds import pipeline_bound, stage_deferrals
from ratrain.planner.layouts import Layout, PlanRequest, needs_device_grad_sum
from ratrain.planner.unit_table import UnitTable
from ratrain.sim.placement import state_model


class UnitTables:
    """Unit tables, one per stage of a layout, shared by every layout of one shape, lifecycle
    and device group."""

    def __init__(self, request: PlanRequest):
        self.request = request
        self._cache: dict[tuple, UnitTable] = {}
        self._least: dict[tuple, float] = {}  # _least_work's, per _tables_key
        self._rho: dict[tuple, float] = {}  # _own_micro's, per _tables_key
        self._bounds: dict[tuple, float] = {}  # layout_bound's, per _tables_key and pp

    def __call__(self, layout: Layout) -> list[UnitTable]:
        by_group = {g: self.table(layout, g) for g in set(layout.groups)}
        return [by_group[g] for g in layout.groups]

    def table(self, layout: Layout, group: int) -> UnitTable:
        r = self.request
        model = state_model(r.model, layout.pp)  # a tied head's copy at pp > 1
        key = (layout.micro_batch_size, layout.n_micro, layout.dp, layout.lifecycle, group,
               model.tie_embeddings)
        if key not in self._cache:
            profile = r.profile.for_group(group)
            self._cache[key] = UnitTable(
                model, profile, layout.micro_batch_size, r.seq_len, r.dtype, layout.n_micro,
                layout.lifecycle, r.clip, r.limit_of(group), r.host_limit_of(group), layout.dp,
                sums_on_device=needs_device_grad_sum(r, layout.lifecycle.state_home, layout.dp))
        scheduled = (*key, layout.schedule, layout.weight_grad)
        if scheduled not in self._cache:
            self._cache[scheduled] = self._cache[key].scheduled(layout.schedule, layout.weight_grad)
        return self._cache[scheduled]

    def _tables_key(self, layout: Layout) -> tuple:
        """What the tables of a layout's groups depend on (as `table` keys them), without
        making them: the bounds ask for them hundreds of thousands of times a search."""
        tied = self.request.model.tie_embeddings and layout.pp == 1
        return (layout.micro_batch_size, layout.n_micro, layout.dp, layout.lifecycle,
                tuple(sorted(set(layout.groups))), tied, layout.schedule, layout.weight_grad)

    def layout_bound(self, layout: Layout) -> float:
        """No partition of the layout steps sooner than this (bounds.pipeline_bound): the same
        for every layout of one set of tables and pipeline depth (rank orders, for one, differ
        in their links, which the bound leaves out)."""
        tables_key = self._tables_key(layout)
        key = (tables_key, layout.pp)
        if key not in self._bounds:
            work = self._least_work(tables_key, layout)
            self._bounds[key] = (
                pipeline_bound(work, layout.n_micro, layout.pp) if layout.weight_grad is None
                else pipeline_bound(self._least_work(tables_key, layout, chained=True),
                                    layout.n_micro, layout.pp, work,
                                    self._own_micro(tables_key, layout)))
        return self._bounds[key] / self.request.fastest_compute(layout)

    def _distinct_tables(self, layout: Layout) -> list[UnitTable]:
        """One table per kind of device the layout's stages run on."""
        return [self.table(layout, g) for g in sorted(set(layout.groups))]

    def _least_work(self, tables_key: tuple, layout: Layout, chained: bool = False) -> float:
        """One micro-batch's forward and backward through the model, each unit on the fastest
        device of the layout's groups; `chained`: without the weight halves of a split
        backward (what the pipeline's critical path chains)."""
        key = (tables_key, chained)
        if key not in self._least:
            tables = self._distinct_tables(layout)
            self._least[key] = sum(
                min(t.forward[u] + t.backward[u] - (t.weight[u] if chained else 0.0)
                    for t in tables) for u in range(tables[0].n_units))
        return self._least[key]

    def _own_micro(self, tables_key: tuple, layout: Layout) -> float:
        """pipeline_bound's c for a split layout: m, and the BWs each stage runs before its
        last BI (all but its deferrals, at most max(stage_deferrals)) at rho, the least ratio
        of a unit's BW to its forward and BI over the layout's devices."""
        m = layout.n_micro
        before = m - stage_deferrals(layout.weight_grad, layout.pp, m)[-1]  # the most
        if not before:
            return float(m)
        if tables_key not in self._rho:
            tables = self._distinct_tables(layout)
            chained = [min(t.forward[u] + t.backward[u] - t.weight[u] for t in tables)
                       for u in range(tables[0].n_units)]
            weight = [min(t.weight[u] for t in tables) for u in range(tables[0].n_units)]
            self._rho[tables_key] = min(w / x for w, x in zip(weight, chained) if x > 0)
        return m + before * self._rho[tables_key]
