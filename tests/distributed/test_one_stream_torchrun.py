"""Under torchrun a node's ranks read the stream its first rank checked: each keyed the files
itself, and one that keyed them after they changed (a corpus still being written) waited for a
cache entry that the first rank, having keyed them before, never wrote."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from .conftest import micro_config

pytestmark = pytest.mark.dist

# Local rank 1 keys the files once rank 0 has tokenized them, and only after appending to one.
STARTER = '''
import os, sys, time
from pathlib import Path
from ratrain.data import tokens
if os.environ["LOCAL_RANK"] == "1":
    key = tokens._cache_key
    def after_a_write(tokenizer, root, files):
        while not list(Path(os.environ["RATRAIN_CACHE"], "tokens").glob("*.bin")):
            time.sleep(0.05)
        with open(files[0], "a") as f:
            f.write("appended while the run started\\n")
        return key(tokenizer, root, files)
    tokens._cache_key = after_a_write
from ratrain.cli import main
sys.argv[0] = "ratrain"
main()
'''


def test_a_local_rank_reads_its_node_first_ranks_stream(corpus, tmp_path):
    data, cache = tmp_path / "text", tmp_path / "cache"
    shutil.copytree(corpus[0], data)
    cfg = micro_config(data, cache, steps=2)
    cfg.train.eval_every, cfg.train.checkpoints = 0, False
    cfg.save(tmp_path / "run.yaml")
    (tmp_path / "starter.py").write_text(STARTER)
    env = {**os.environ, "RATRAIN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(tmp_path / "starter.py"), "train", "--config", str(tmp_path / "run.yaml"),
         "--pp", "2", "--run-dir", str(tmp_path / "run"), "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=120)  # (a guard: before, rank 1 waited forever)
    finally:
        if proc.poll() is None:  # torchrun starts its workers in sessions of their own
            workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                     text=True).stdout.split()
            for pid in [*map(int, workers), proc.pid]:
                os.kill(pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert len(list((cache / "tokens").glob("*.bin"))) == 1  # the stream rank 0 checked
    assert "waiting for this node's first rank" not in stderr
