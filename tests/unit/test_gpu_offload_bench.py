"""bench/gpu_offload.py: ratrain against the FSDP2 CPU-offload peer, end to end on a small
model (CPU: the peer without pinning; CUDA: the real setting, skipped without a GPU), and the
peer's micro-batch search on made-up runs."""

from __future__ import annotations

import json

import pytest
import torch

from .bench_loader import load_bench

gpu_offload = load_bench("gpu_offload")

SMALL = ["--model", "tiny", "--layers", "1", "--seq-len", "32", "--global-batch", "2",
         "--steps", "2", "--peer-micro-batch-sizes", "2,1",
         # no schedule simulation and no matmul timing at ratrain's start: seconds on 2 cores
         "--ratrain-flags", "--schedule 1f1b --profile cpu-local"]


@pytest.fixture(scope="module")
def ratrain_alone(tmp_path_factory):
    """`--rows ratrain`'s result file, run once: its row is what the tests below cut short or
    merge (each run of a row is a process that imports torch, seconds on 2 cores)."""
    out = tmp_path_factory.mktemp("ratrain_alone") / "r.json"
    assert gpu_offload.main([*SMALL, "--device", "cpu", "--dtype", "float32", "--rows", "ratrain",
                             "--out", str(out)]) == 0
    return out


def test_both_rows_train_the_same_weights_on_the_same_batches_on_cpu(tmp_path):
    out = tmp_path / "r.json"
    assert gpu_offload.main([*SMALL, "--device", "cpu", "--dtype", "float32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    ratrain, peer = result["rows"]["ratrain"], result["rows"]["fsdp2-offload"]
    assert len(ratrain["losses"]) == len(peer["losses"]) == 2
    assert ratrain["tokens_per_s"] > 0 and peer["tokens_per_s"] > 0
    assert ratrain["peak_host_bytes"] > 0 and peer["peak_host_bytes"] > 0
    # fp32, the same weights and tokens: only the micro-batches differ (ratrain 2 x 1, the
    # peer 1 x 2), so the sums' order; measured 8e-8 at step 1
    assert result["losses"]["max_rel_diff"] < 1e-5 and result["losses"]["within_tolerance"]
    assert peer["micro_batch_size"] == 2 and not peer["pinned"]
    assert "CPUOffloadPolicy(pin_memory=False)" in peer["description"]
    assert result["peer_tried"] == [{"micro_batch_size": 2, "outcome": "fits"}]
    assert "--state-home host" in ratrain["commands"][-1]


def test_ratrains_row_is_kept_when_the_peer_does_not_finish(tmp_path, monkeypatch,
                                                           ratrain_alone):
    """A GPU session's call has a time limit, and the peer tries micro-batch sizes one process
    each: ratrain's row is written before the peer runs, so a call cut short keeps it."""
    def cut(*args):
        raise KeyboardInterrupt  # as the caller's timeout would stop it

    # the row a real run of these settings made, not a second run: this test is of when main()
    # writes the row (before the peer), the other tests of how the row is made
    made = json.loads(ratrain_alone.read_text())["rows"]["ratrain"]
    monkeypatch.setattr(gpu_offload, "run_ratrain", lambda *args: made)
    monkeypatch.setattr(gpu_offload, "choose_peer", cut)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_offload.main([*SMALL, "--device", "cpu", "--dtype", "float32", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["partial"] and len(result["rows"]["ratrain"]["losses"]) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpu_rows_run_under_the_memory_cap(tmp_path):
    out = tmp_path / "r.json"
    assert gpu_offload.main([*SMALL, "--device", "cuda", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    ratrain, peer = result["rows"]["ratrain"], result["rows"]["fsdp2-offload"]
    assert peer["pinned"] and ratrain["memory_cap"]
    assert 0 < peer["peak_cuda_bytes"] <= 20e9 and 0 < ratrain["peak_cuda_bytes"] <= 20e9
    assert result["losses"]["within_tolerance"], result["losses"]


def test_the_peer_takes_the_largest_micro_batch_that_runs_every_step():
    runs = {8: {"oom": "step 0: CUDA out of memory"}, 4: {"losses": [1.0]}, 2: {"losses": [1.0]}}
    asked = []

    def run_at(size):
        asked.append(size)
        return runs[size]

    chosen, tried = gpu_offload.choose_peer([2, 8, 4], run_at)
    assert chosen is runs[4] and asked == [8, 4]
    assert tried == [{"micro_batch_size": 8, "outcome": "OOM at step 0: CUDA out of memory"},
                     {"micro_batch_size": 4, "outcome": "fits"}]
    chosen, tried = gpu_offload.choose_peer([1], lambda s: {"error": "peer exit 1: boom"})
    assert chosen is None and tried[0]["outcome"] == "peer exit 1: boom"


def test_the_loss_check_uses_the_dtype_tolerance():
    c = gpu_offload.compare_losses([2.0, 1.01], [2.0, 1.0], "bfloat16")
    assert c["at_step"] == 2 and abs(c["max_rel_diff"] - 0.01) < 1e-12 and c["within_tolerance"]
    assert not gpu_offload.compare_losses([2.0, 1.01], [2.0, 1.0], "float32")["within_tolerance"]


def test_one_row_alone_and_a_stopped_peers_steps_are_kept(tmp_path, ratrain_alone):
    """A GPU session can run the rows in separate calls (`--rows`); a time limit's SIGTERM
    while the peer runs keeps the steps it had run, and stops its process (which holds the GPU
    on a GPU)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = ratrain_alone
    result = json.loads(out.read_text())
    assert len(result["rows"]["ratrain"]["losses"]) == 2
    assert result["rows"]["fsdp2-offload"] == {"skipped": "--rows ratrain"}
    peer = tmp_path / "p.json"
    assert gpu_offload.main([*SMALL, "--device", "cpu", "--dtype", "float32", "--rows", "peer",
                             "--out", str(peer)]) == 0
    both = tmp_path / "both.json"
    assert gpu_offload.main(["--merge", str(out), str(peer), "--out", str(both)]) == 0
    merged = json.loads(both.read_text())
    assert merged["losses"]["within_tolerance"] and merged["losses"]["max_rel_diff"] < 1e-5
    assert merged["rows"]["fsdp2-offload"]["micro_batch_size"] == 2
    other = json.loads(peer.read_text())
    other["settings"]["steps"] = 3
    peer.write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="steps 2 / 3"):
        gpu_offload.main(["--merge", str(out), str(peer), "--out", str(both)])

    work, out = tmp_path / "work", tmp_path / "stopped.json"
    args = list(SMALL)
    args[args.index("--steps") + 1] = "500"
    err = tmp_path / "err.txt"
    with open(err, "w") as stderr:
        bench = subprocess.Popen([sys.executable, str(Path(gpu_offload.__file__)), *args,
                                  "--device", "cpu", "--dtype", "float32", "--rows", "peer",
                                  "--work-dir", str(work), "--out", str(out)],
                                 stderr=stderr, stdout=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not list(work.glob("peer-*.out.steps")) and time.time() < deadline:
            time.sleep(0.2)
        bench.send_signal(signal.SIGTERM)
        code = bench.wait(30)
    assert code == 128 + signal.SIGTERM, err.read_text()[-2000:]
    result = json.loads(out.read_text())
    assert result["partial"] == "stopped while the peer ran"
    assert result["rows"]["ratrain"] == {"skipped": "--rows peer"}
    assert 1 <= len(result["peer_steps"]["losses"]) < 500
    peer_logs = list(work.glob("peer-*.log"))
    assert peer_logs  # and no peer process is left
    ps = subprocess.run(["pgrep", "-f", "gpu_offload_peer.py " + str(work)], capture_output=True)
    assert ps.returncode == 1, ps.stdout


def test_the_table_sets_ratrains_measured_rate_and_peaks_beside_its_plans_prediction():
    report = load_bench("gpu_offload_report")
    row = {"tokens_per_s": 6000.0, "peak_cuda_bytes": 17.0e9, "peak_host_bytes": 104e9,
           "prediction": {"tokens_per_s": 6933.0, "stage_peak_bytes": [17.69e9],
                          "stage_host_peak_bytes": [105.7e9]}}
    line = report.predicted(row)[-1]
    assert line.startswith("ratrain's plan predicted 6933 tokens/s: measured -13.5%")
    assert "device peak 17.69 GB (measured 17.00 GB allocated)" in line
    assert "host state 105.70 GB (peak host RSS 104.00 GB)" in line
    assert report.predicted({**row, "prediction": None}) == []  # fixed flags: no plan
