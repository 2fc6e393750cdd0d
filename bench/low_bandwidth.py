"""Low-bandwidth training: synchronous `ratrain` against `--sync diloco:H` (and Streaming DiLoCo)
on two nodes joined by a slow link (issue 38, item 6).

Each run is one `ratrain train` on two "nodes" (bench/two_nodes.py: network namespaces, a veth
pair shaped by tbf, torchrun in each), dp = 2 with one replica per node (pp = 2 runs use
`--rank-order dp-pp`, so a replica's stages share a node and only the replica sync crosses the
link). While it runs, a sampler reads the veth's transmitted bytes from /proc/PID/net/dev of a
process inside each namespace (the kernel's counter, not a computed figure) together with the
number of rows in rank 0's metrics.jsonl, every 50 ms. So each step's bytes are the counter's
growth between two step rows, and the wall time of each step is when its row appeared.

    sudo .venv/bin/python bench/low_bandwidth.py --run 100mbit,step,600 --run 100mbit,diloco:50,600
    .venv/bin/python bench/low_bandwidth.py --report     # plots and table from the results file
    sudo .venv/bin/python bench/low_bandwidth.py --start-lines 100mbit   # what a default run says

A run spec is RATE[+DELAY],SYNC,STEPS[,PP[xDP][,FLAGS]] (DELAY: one way, such as 25ms, through
bench/delayed_link.py; DP: replicas, 2 unless given, half on each node: 1x4 puts replicas 0-1 on
node A and 2-3 on node B, the islands of `:islands=2`; FLAGS: more `ratrain train` flags,
space-separated). Results accumulate in --out (one entry per run, written
after each run, so a long sweep that is stopped keeps what it finished).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from two_nodes import LinkUnavailable, TwoNodes, parse_link  # noqa: E402

DEFAULT_OUT = REPO / "bench/results/low_bandwidth.json"
# The shape of every run: tiny, 256 tokens, 4 sequences a step (2 per replica: one micro-batch
# of 2 at pp = 1, two of 1 at pp = 2), the training defaults otherwise (lr 3e-3, cosine over
# --steps, clip 1.0, eval every 100). 4 sequences keep 600 steps of the synchronous run within
# about a quarter of an hour on the 2-core VM; its gradient sync is link-bound at 100 Mbit/s.
GLOBAL_BATCH, SEQ_LEN = 4, 256
SHAPE = ["--model", "tiny", "--seq-len", str(SEQ_LEN), "--global-batch", str(GLOBAL_BATCH)]


def parse_spec(text: str) -> dict:
    parts = text.split(",")
    if len(parts) not in (3, 4, 5):
        raise SystemExit(f"--run {text!r}: expected RATE[+DELAY],SYNC,STEPS[,PP[xDP][,FLAGS]]")
    parse_link(parts[0])
    pp, _, dp = (parts[3] if len(parts) > 3 else "1").partition("x")
    return {"rate": parts[0], "sync": parts[1], "steps": int(parts[2]), "pp": int(pp),
            "dp": int(dp or 2), "flags": parts[4] if len(parts) > 4 else ""}


def label(spec: dict) -> str:
    flags = f" {spec['flags']}" if spec.get("flags") else ""
    dp = f" dp={spec['dp']}" if spec.get("dp", 2) != 2 else ""
    return f"{spec['rate']} pp={spec['pp']}{dp} {spec['sync']}{flags} ({spec['steps']} steps)"


class Sampler(threading.Thread):
    """Every 50 ms: (seconds since start, tx bytes of each node's veth, rows in metrics.jsonl)."""

    def __init__(self, net: TwoNodes, metrics: Path):
        super().__init__(daemon=True)
        self.net, self.metrics = net, metrics
        self.samples: list[tuple[float, int, int, int]] = []
        self.stop = threading.Event()
        self.t0 = time.perf_counter()
        self._pids: list[str | None] = [None, None]

    def _tx(self, node: int) -> int | None:
        """The veth's transmitted bytes as seen inside namespace `node` (its /proc/PID/net/dev
        is that namespace's; a pid found once by `ip netns pids`, again if it has ended)."""
        for _ in range(2):
            if self._pids[node] is None:
                out = subprocess.run(["ip", "netns", "pids", self.net.ns[node]],
                                     capture_output=True, text=True).stdout.split()
                if not out:
                    return None
                self._pids[node] = out[0]
            try:
                text = Path(f"/proc/{self._pids[node]}/net/dev").read_text()
            except OSError:
                self._pids[node] = None
                continue
            for line in text.splitlines():
                name, _, rest = line.partition(":")
                if name.strip() == self.net.dev[node]:
                    return int(rest.split()[8])  # receive: 8 fields, then transmit bytes
            return None
        return None

    def run(self) -> None:
        while not self.stop.is_set():
            tx = [self._tx(0), self._tx(1)]
            try:
                rows = self.metrics.read_bytes().count(b"\n")
            except OSError:
                rows = 0
            if None not in tx:
                self.samples.append((time.perf_counter() - self.t0, tx[0], tx[1], rows))
            self.stop.wait(0.05)


def per_step(samples: list, steps: int) -> tuple[list[float], list[int]]:
    """Each step's wall time (when its row first appeared) and the bytes both nodes sent
    between the previous step's row and its own (step 1: since the first sample)."""
    when, sent = [], []
    prev_tx = samples[0][1] + samples[0][2]
    k = 0
    for step in range(1, steps + 1):
        while k < len(samples) and samples[k][3] < step:
            k += 1
        if k == len(samples):
            break
        t, a, b, _ = samples[k]
        when.append(t)
        sent.append(a + b - prev_tx)
        prev_tx = a + b
    return when, sent


def steps_per_s(samples: list) -> float:
    """Steps a second by the wall clock, from the first sample with a row (the start and step 1
    before it) to the last: rows that appear several at once (--sync diloco writes them where
    the replicas meet) count from when they appeared."""
    first = next(s for s in samples if s[3] >= 1)
    last = samples[-1]
    return (last[3] - first[3]) / (last[0] - first[0])


def run_one(spec: dict, work: Path, port: int, invocation: str) -> dict:
    run_dir = work / "run"
    pp, dp = spec["pp"], spec.get("dp", 2)
    argv = ["-m", "ratrain.cli", "train", *SHAPE, "--pp", str(pp), "--dp", str(dp),
            "--steps", str(spec["steps"]), "--micro-batch-size", str(max(1, GLOBAL_BATCH // dp // pp)),
            "--sync", spec["sync"], "--run-dir", str(run_dir),
            "--no-checkpoints", "--no-trace", "--no-report", "--no-progress", "--threads", "1"]
    if spec["pp"] > 1:
        argv += ["--rank-order", "dp-pp"]
    argv += spec.get("flags", "").split()  # e.g. "--outer-lr 1 --outer-momentum 0"
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with TwoNodes(spec["rate"]) as net:
        sampler = Sampler(net, run_dir / "metrics.jsonl")
        sampler.start()
        t0 = time.perf_counter()
        try:
            net.run(pp * dp // 2, argv, port, work, cwd=REPO)
        finally:
            sampler.stop.set()
            sampler.join()
        wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    when, sent = per_step(sampler.samples, len(rows))
    tokens = GLOBAL_BATCH * SEQ_LEN
    timed = rows[1:]  # step 1 pays for warm-up allocations
    return {**spec, "invocation_utc": invocation, "started_utc": started, "wall_s": wall,
            "argv": ["ratrain", *argv[2:]], "tokens_per_step": tokens,
            "tokens_per_s": tokens * len(timed) / sum(r["step_time_s"] for r in timed),
            "tokens_per_s_wall": tokens * steps_per_s(sampler.samples),
            "loss": [r["loss"] for r in rows], "val_loss": {r["step"]: r["val_loss"] for r in rows
                                                            if "val_loss" in r},
            "step_time_s": [r["step_time_s"] for r in rows], "wall_at_step": when,
            "bytes_at_step": sent, "total_tx_bytes": sampler.samples[-1][1] + sampler.samples[-1][2]
            - sampler.samples[0][1] - sampler.samples[0][2]}


def start_lines(spec: str) -> int:
    rate, _, dp = spec.partition(",")
    dp = int(dp or 2)
    argv = ["-m", "ratrain.cli", "train", "--model", "tiny", "--pp", "1", "--dp", str(dp),
            "--global-batch", "8", "--micro-batch-size", str(8 // dp // 2), "--steps", "3",
            "--no-checkpoints", "--no-report", "--threads", "1"]
    with tempfile.TemporaryDirectory() as tmp, TwoNodes(rate) as net:
        net.run(dp // 2, [*argv, "--run-dir", str(Path(tmp) / "run")], 29590, Path(tmp), cwd=REPO)
        said = (Path(tmp) / "node0.log").read_text(errors="replace").splitlines()
    for line in said:
        if line.startswith(("links measured", "schedule ", "low-communication")):
            print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", default=[], type=parse_spec, metavar="RATE[+DELAY],SYNC,STEPS[,PP[xDP][,FLAGS]]")
    ap.add_argument("--out", type=Path, help=f"the results file [default: {DEFAULT_OUT}]")
    ap.add_argument("--report", action="store_true", help="plots and table from --out; runs nothing")
    ap.add_argument("--plot", type=Path, help="--report's figure [default: beside --out, as .png; "
                                              "docs/low_bandwidth.png for the default --out]")
    ap.add_argument("--start-lines", metavar="RATE[,DP]",
                    help="run 3 steps of `ratrain train --pp 1 --dp DP` (2 unless given: DP / 2 "
                         "ranks a node) with default flags (two micro-batches per replica) over "
                         "RATE and print what rank 0 said at the start: the links probed, the "
                         "schedule chosen, the low-communication hint")
    args = ap.parse_args(argv)
    out = args.out or DEFAULT_OUT
    if args.report:
        from low_bandwidth_report import report
        if not out.is_file():
            ap.error(f"--out {out} does not exist: nothing to report")
        png = args.plot or (out.with_suffix(".png") if args.out else REPO / "docs/low_bandwidth.png")
        return report(out, png)
    if args.start_lines:
        return start_lines(args.start_lines)
    done = json.loads(out.read_text()) if out.exists() else []
    invocation = datetime.now(timezone.utc).isoformat(timespec="seconds")  # x sync's pairing
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    for i, spec in enumerate(args.run):
        print(f"== {label(spec)} ==", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                res = run_one(spec, Path(tmp), 29600 + i, invocation)
            except LinkUnavailable as e:
                print(f"two nodes need root and network namespaces: {e}", file=sys.stderr)
                return 2
        done = [d for d in done if label(d) != label(spec)] + [res]
        out.write_text(json.dumps(done, indent=1))
        print(f"wrote {out}")
        mb = sorted(res["bytes_at_step"])
        print(f"{label(spec)}: {res['tokens_per_s']:.0f} tokens/s ({res['tokens_per_s_wall']:.0f} by "
              f"wall clock), final loss {res['loss'][-1]:.4f}, val {res['val_loss']}, "
              f"{res['total_tx_bytes'] / len(res['loss']) / 1e6:.2f} MB sent per step "
              f"(peak step {mb[-1] / 1e6:.2f} MB), {res['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
