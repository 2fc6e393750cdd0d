"""Under pytest-xdist (scripts/test.sh: two workers on a two-core machine) every worker, and
every process it starts, computes on one thread. Two workers of two threads each would put four
busy-waiting OpenMP threads on two cores: a bf16 test took 65 s instead of 6 that way."""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The default run's file (tests/e2e: minutes on one thread) first, so that one worker runs
    it beside the others' files rather than alone after them."""
    items.sort(key=lambda item: item.path.parent.name != "e2e")
