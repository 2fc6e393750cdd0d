"""The resource-aware planner (pure Python): search pipeline and data-parallel degrees,
micro-batching, layer partition and per-stage memory policies for the fastest plan that fits a
memory budget, judged by the simulator; explain what would fit when nothing does."""
