"""Under pytest-xdist (scripts/test.sh: two workers on a two-core machine) every worker, and
every process it starts, computes on one thread. Two workers of two threads each would put four
busy-waiting OpenMP threads on two cores: a bf16 test took 65 s instead of 6 that way."""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


# The files that keep one worker busy for minutes go first: handed out last, they left the other
# worker idle at the end (2026-11-27: the default run's 5 minutes ran alone for the last ~2).
# scripts/test.sh passes --no-loadscope-reorder, so xdist hands files out in this order; a
# file missing from the list is only scheduled in its place among the rest.
STARTED_FIRST = ("tests/e2e/test_default_run.py", "tests/unit/test_planner.py")


def pytest_collection_modifyitems(config, items):
    first = {path: i for i, path in enumerate(STARTED_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))
