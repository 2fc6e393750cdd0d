"""Two "nodes" on one machine: network namespaces joined by a veth pair whose both ends are
shaped by a `tbf` qdisc, and torchrun started in each (the recipe in docs/machines.md; needs root).

    with TwoNodes("200mbit") as net:
        net.run(ranks_per_node, ["-m", "ratrain.cli", "train", ...], port=29500, log_dir=Path("logs"))

The addresses 10.231.0.1 and .2 exist only on the link, inside the two namespaces;
`GLOO_SOCKET_IFNAME` points gloo at it, so traffic between the nodes crosses the shaped link
and traffic inside a node stays local. A link with a delay ("200mbit+25ms": 25 ms each way, a
50 ms round trip) is a pair of tun devices and a relay in this process (bench/delayed_link.py)
in place of the veth pair.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from delayed_link import MTU, DelayRelay
from ratrain.errors import UserError

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}  # tc's units (bps = bytes/s)


def parse_link(text: str) -> tuple[str, float]:
    """RATE[+DELAY] ("200mbit", "200mbit+25ms"): the tc rate and the one-way delay in seconds."""
    rate, _, delay = text.partition("+")
    parse_rate(rate)
    if not delay:
        return rate, 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)ms", delay.strip())
    if not m:
        raise UserError(f"--link: {text!r}: the delay after '+' is in ms, such as 200mbit+25ms")
    return rate, float(m[1]) / 1000


def parse_rate(text: str) -> float:
    """A tc rate ("200mbit", "25mbps") in bits per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", text.strip().lower())
    if not m or m[2] not in _RATE_UNITS or float(m[1]) <= 0:
        raise UserError(f"--link: {text!r} is not a tc rate such as 200mbit, 1gbit or 25mbps "
                        f"(units: {', '.join(_RATE_UNITS)})")
    return float(m[1]) * _RATE_UNITS[m[2]]


class LinkUnavailable(Exception):
    """Network namespaces, veth or tbf cannot be set up here (not root, not permitted, no tc)."""


class TwoNodes:
    """Two network namespaces joined by a veth pair, a tbf qdisc of `rate` on both ends.

    Addresses 10.231.0.1/24 and .2/24 exist only on the veth pair, inside the two namespaces;
    names carry this process's pid. Everything is removed on exit, also after Ctrl-C.
    """

    def __init__(self, link: str):
        tag = f"rtb{os.getpid()}"
        self.rate, self.delay_s = parse_link(link)
        self.ns = (f"{tag}a", f"{tag}b")
        self.dev = (f"{tag}va", f"{tag}vb")
        self.addr = ("10.231.0.1", "10.231.0.2")
        self._made: list[str] = []
        self._relay = None

    @staticmethod
    def _run(*cmd: str) -> None:
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except FileNotFoundError:
            raise LinkUnavailable(f"`{cmd[0]}` not found") from None
        except subprocess.CalledProcessError as e:
            msg = (e.stderr or e.stdout or "").strip().splitlines()
            raise LinkUnavailable(f"`{' '.join(cmd)}` failed: {msg[-1] if msg else e.returncode}") from None

    def __enter__(self) -> TwoNodes:
        try:
            for ns in self.ns:
                self._run("ip", "netns", "add", ns)
                self._made.append(ns)
            if self.delay_s:
                try:
                    self._relay = DelayRelay(self.dev, self.delay_s)
                except OSError as e:
                    raise LinkUnavailable(f"no tun device: {e}") from None
            else:
                self._run("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name",
                          self.dev[1])
                self._made.append("veth")
            for ns, dev, addr, peer in zip(self.ns, self.dev, self.addr, self.addr[::-1]):
                self._run("ip", "link", "set", dev, "netns", ns)
                if self._relay:  # a point-to-point tun: the peer's address is the route
                    self._run("ip", "-n", ns, "addr", "add", addr, "peer", peer, "dev", dev)
                    self._run("ip", "-n", ns, "link", "set", dev, "mtu", str(MTU))
                else:
                    self._run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                self._run("ip", "-n", ns, "link", "set", "lo", "up")
                self._run("ip", "-n", ns, "link", "set", dev, "up")
                self._run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                          "rate", self.rate, "burst", "256kb", "latency", "100ms")
            if self._relay:
                self._relay.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        # Deleting a namespace destroys the veth end inside it, and with it the pair.
        if "veth" in self._made:
            subprocess.run(["ip", "link", "del", self.dev[0]], capture_output=True)  # if never moved
        for ns in self.ns:
            if ns in self._made:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        if self._relay:  # after the namespaces: their tun devices went with them
            self._relay.close()
            self._relay = None

    def run(self, k: int, argv: list[str], port: int, log_dir: Path, cwd: Path | None = None) -> None:
        """Run `torchrun ... argv` in each namespace, k ranks per node (node A: ranks 0..k-1,
        node B: k..2k-1), and wait; if one node fails, stop the other and raise with the tail
        of its log. Node A's stdout is ours, the rest goes to log_dir/node{0,1}.log."""
        procs: list[subprocess.Popen] = []
        logs = []
        try:
            for node in (0, 1):
                cmd = ["ip", "netns", "exec", self.ns[node], "env",
                       f"GLOO_SOCKET_IFNAME={self.dev[node]}", "OMP_NUM_THREADS=1",
                       sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                       "--node-rank", str(node), "--nproc-per-node", str(k),
                       "--master-addr", self.addr[0], "--master-port", str(port),
                       *argv]
                log = open(log_dir / f"node{node}.log", "w")
                logs.append(log)
                # Node A holds rank 0, whose progress lines go to our stdout.
                procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=None if node == 0 else log,
                                              stderr=log, start_new_session=True))
            while any(p.poll() is None for p in procs):
                if any(p.returncode not in (None, 0) for p in procs):
                    break  # one node failed: the other would wait for its peers until timeout
                time.sleep(0.2)
        finally:
            for p in procs:
                _stop(p)
            for log in logs:
                log.close()
        codes = [p.returncode for p in procs]
        if any(codes):
            tail = "\n".join(line for i, c in enumerate(codes) if c
                             for line in (log_dir / f"node{i}.log").read_text().splitlines()[-15:])
            raise RuntimeError(f"torchrun exited with {codes}; last lines of its log:\n{tail}")


def _stop(proc: subprocess.Popen) -> None:
    """End a torchrun we started, and its workers (its own session), if still running."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass
