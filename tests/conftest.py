"""Under pytest-xdist (scripts/test.sh: two workers on a two-core machine) every worker, and
every process it starts, computes on one thread. Two workers of two threads each would put four
busy-waiting OpenMP threads on two cores: a bf16 test took 65 s instead of 6 that way."""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

