"""scripts/gpu_check.sh, the one script a GPU session runs in its 15 minutes: its sections'
commands at a toy size on this CPU (SMOKE=1), so that a flag or file a change renamed shows
here rather than in a GPU call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H200_PROFILE = ROOT / "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml"


def test_the_gpu_sections_run_at_a_toy_size(tmp_path):
    """The host-homed 7B blocks with their trace, the simulator on a given profile, the FSDP2
    peer beside the plan `ratrain plan` finds on the H200 profile, and the checkpoint saved
    while training goes on and resumed: every command exits 0 and leaves its files."""
    # the fewest blocks, sequences and checkpointed blocks each section's commands run with:
    # every one a process on the suite's 2 cores (4 blocks, a batch of 16 and the ckpt's blocks
    # as many as the disk allows, up to 32, took ~80 s of the test's ~100)
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "SECTIONS": "7b_host profile offload32 ckpt", "PROFILE": str(H200_PROFILE),
           "CKPT_DIR": str(tmp_path), "RATRAIN_CACHE": str(tmp_path / "cache"),
           "BLOCKS": "1", "OFFLOAD_BATCH": "4", "CKPT_MAX_BLOCKS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    log = (tmp_path / "out" / "log.txt").read_text()
    assert proc.returncode == 0, proc.stderr + log
    codes = dict(re.findall(r"^== (\S+) rc=(\d+)", log, re.M))
    assert codes == {"llama7b_host": "0", "gpu_offload_32blocks_b4": "0", "ckpt": "0"}, log
    out = tmp_path / "out"
    for name in ("llama7b_host.json", "llama7b_host.trace.json", "gpu_profile.yaml",
                 "gpu_offload_32blocks_b4.json", "checkpoint_save.json"):
        assert (out / name).stat().st_size > 0, name
    simulated = (out / "simulate.txt").read_text()
    assert simulated.count("tokens/s") == 2 and "error" not in simulated, simulated
