"""Whether this process is one of the ranks torchrun (or a launcher like it) started: a
question the command line asks before anything imports torch."""

from __future__ import annotations

import os


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )
