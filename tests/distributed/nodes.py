"""`ratrain train` as torchrun nodes of one rank each, in this machine's processes: torchrun's
environment set by hand (so that a test can signal one node's rank alone), each node in a
directory of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def start_nodes(corpus, config: Path, run_id: str, flags: list[list[str]]
                ) -> list[subprocess.Popen]:
    """One `ratrain train --config config --dp N --run-dir run` per entry of `flags` (that
    node's own flags besides), node R in config's folder's node_R."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, own in enumerate(flags):
        node = config.parent / f"node_{rank}"
        node.mkdir()
        env = {**os.environ, "RATRAIN_CACHE": str(corpus[1]), "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(flags)),
               "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ratrain.cli", "train", "--config", str(config), "--dp",
             str(len(flags)), "--run-dir", "run", "--no-progress", "--no-trace", "--no-report",
             *own], cwd=node, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    return procs
