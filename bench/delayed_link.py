"""A link with a one-way delay, for two network namespaces (bench/two_nodes.py): a tun device for
each, and a relay in this process that reads every packet one of them sends and writes it into
the other `delay` later. netem would add the delay in the kernel, but not every kernel has it
(this VM's does not: "Specified qdisc kind is unknown"); tbf, which shapes the rate, cannot.

The relay is Python: through it a TCP stream reached ~40 MB/s (320 Mbit/s) with a 50 ms round
trip on the 2-core Xeon VM (64 KB packets), so shape the rate below that with tbf on the tun
devices. Packets keep their order in each direction; none are dropped by the relay.
"""

from __future__ import annotations

import fcntl
import os
import queue
import struct
import threading
import time

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
MTU = 65000  # few packets for the relay's Python to move; the kernel cuts nothing on a tun


def open_tun(name: str) -> int:
    """A tun device of this name in this process's network namespace, and its descriptor
    (the device lives while the descriptor is open, wherever the device is moved)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


class DelayRelay:
    """Two tun devices' packets, each written into the other `delay_s` after it was read."""

    def __init__(self, names: tuple[str, str], delay_s: float):
        self.names, self.delay_s = names, delay_s
        self.fds = [open_tun(n) for n in names]
        self._closed = threading.Event()

    def start(self) -> None:
        for src, dst in ((0, 1), (1, 0)):
            due: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=self._read, args=(self.fds[src], due), daemon=True).start()
            threading.Thread(target=self._write, args=(self.fds[dst], due), daemon=True).start()

    def _read(self, fd: int, due: queue.SimpleQueue) -> None:
        while not self._closed.is_set():
            try:
                packet = os.read(fd, MTU + 64)
            except OSError:  # the device went with its namespace
                break
            due.put((time.monotonic() + self.delay_s, packet))
        due.put((0.0, None))

    def _write(self, fd: int, due: queue.SimpleQueue) -> None:
        while True:
            at, packet = due.get()
            if packet is None:
                return
            wait = at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                os.write(fd, packet)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
