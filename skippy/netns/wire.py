"""The userspace link emulator: delay and jitter between namespace hosts where the kernel has no netem.

Every host of a set routes the other hosts' addresses to its tun device ``wire0`` (see
`skippy.netns.hosts`). This process holds all those tuns open (one per namespace, attached with
setns), reads each IPv4 packet a host sends, and writes it into the destination host's tun after
``delay +- jitter`` (uniform), which the destination kernel then receives as if from a link. So
every host-to-host packet, in each direction, is delayed once, the TCP connections on top are
real end to end (slow start, windows and ACK clocking all see the delay), and any port works.
Packets of one direction (source host -> destination host) leave in order: a jittered packet is
never released before the one sent ahead of it. Rate limits are the kernel's (tbf on ``wire0``);
this emulator does not drop packets, so loss is not emulated.

Run by `scripts/netns-hosts up` as ``python -m skippy.netns.wire STATE.json``: it reads the set's
record, attaches, writes the record's revision to the ack file, and re-reads the conditions on
SIGHUP (acknowledging each revision the same way). SIGTERM ends it; counters go to its log.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
_MAX_PACKET = 65536


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def attach_tun(namespace: str, name: str = "wire0") -> int:
    """A non-blocking fd on the tun ``name`` inside ``namespace`` (this thread's namespace is restored)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(f"/run/netns/{namespace}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
        return fd
    finally:
        if ctypes.CDLL(None, use_errno=True).setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back")
        os.close(home)


class Wire:
    """The packet pump between the tuns of one host set."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ack = state.with_name(state.stem + ".wire-ack")
        record = json.loads(state.read_text())
        self.prefix, subnet, count = record["prefix"], record["subnet"], record["count"]
        self.tuns = {k: attach_tun(f"{self.prefix}-h{k}") for k in range(1, count + 1)}
        self.host_of = {socket.inet_aton(f"{subnet}.{k}"): k for k in self.tuns}
        self.delay_s = self.jitter_s = 0.0
        self.queue: list[tuple[float, int, int, bytes]] = []  # (due, seq, destination host, packet)
        self.last_due: dict[tuple[int, int], float] = {}
        self.counts = {"forwarded": 0, "bytes": 0, "dropped": 0}
        self._seq = 0
        self.reload()

    def reload(self) -> None:
        record = json.loads(self.state.read_text())
        conditions = record["conditions"]
        self.delay_s, self.jitter_s = conditions["delay_ms"] / 1e3, conditions["jitter_ms"] / 1e3
        print(f"{time.strftime('%H:%M:%S')} revision {record['revision']}: delay {conditions['delay_ms']} ms,"
              f" jitter {conditions['jitter_ms']} ms; counters {self.counts}", flush=True)
        tmp = self.ack.with_suffix(".tmp")
        tmp.write_text(str(record["revision"]))
        tmp.replace(self.ack)

    def receive(self, source: int, now: float) -> None:
        """Queue every packet waiting on host ``source``'s tun."""
        while True:
            try:
                packet = os.read(self.tuns[source], _MAX_PACKET)
            except BlockingIOError:
                return
            destination = self.host_of.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
            if destination is None or destination == source:
                self.counts["dropped"] += 1
                continue
            hold = self.delay_s + (random.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0)
            due = max(now + max(hold, 0.0), self.last_due.get((source, destination), 0.0))  # in order per direction
            self.last_due[(source, destination)] = due
            self._seq += 1
            heapq.heappush(self.queue, (due, self._seq, destination, packet))

    def release(self, now: float) -> None:
        while self.queue and self.queue[0][0] <= now:
            _, _, destination, packet = heapq.heappop(self.queue)
            try:
                os.write(self.tuns[destination], packet)
                self.counts["forwarded"] += 1
                self.counts["bytes"] += len(packet)
            except OSError:  # the destination's queue is full or it went away: the packet is lost
                self.counts["dropped"] += 1

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        for k, fd in self.tuns.items():
            selector.register(fd, selectors.EVENT_READ, k)
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        selector.register(wake_r, selectors.EVENT_READ, None)
        signal.set_wakeup_fd(wake_w.fileno())
        pending: list[int] = []
        signal.signal(signal.SIGHUP, lambda sig, _frame: pending.append(sig))
        signal.signal(signal.SIGTERM, lambda sig, _frame: pending.append(sig))
        while True:
            timeout = max(0.0, self.queue[0][0] - time.monotonic()) if self.queue else None
            for key, _ in selector.select(timeout):
                if key.data is None:
                    wake_r.recv(4096)
                else:
                    self.receive(key.data, time.monotonic())
            while pending:
                if pending.pop(0) == signal.SIGTERM:
                    print(f"{time.strftime('%H:%M:%S')} stopping; counters {self.counts}", flush=True)
                    return
                self.reload()
            self.release(time.monotonic())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m skippy.netns.wire /run/skippy-netns/PREFIX.json", file=sys.stderr)
        return 2
    Wire(Path(argv[0])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
