"""scripts/netns-hosts: namespaces that reach each other, link conditions on them, a clean `down`.

No assertion here depends on how fast the machine is. The one timing check is a lower bound the
link emulator guarantees by construction: it holds every packet at least `delay` in each
direction, so a round trip between two hosts takes at least twice the delay, however loaded the
machine is.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest
from netns_helpers import MakeHosts

from skippy.cli.netns import main as netns_hosts_cli
from skippy.netns import (
    HostSet,
    LinkConditions,
    NetnsError,
    down,
    load,
    netem_available,
    set_conditions,
    unavailable_reason,
    up,
)
from skippy.netns.commands import run
from skippy.netns.owner import namespace_of, stage_command_prefix

PORT = 5555  # on the hosts' private addresses only
PING = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(5):
    start = time.perf_counter(); c.sendall(b"x"); c.recv(1); print((time.perf_counter() - start) * 1e3)
"""
ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(); print("listening", flush=True); c, _ = s.accept()
while (data := c.recv(65536)):
    c.sendall(data)
"""


def in_namespace(namespace: str | None) -> list[str]:
    return ["ip", "netns", "exec", namespace] if namespace else []


def round_trips_ms(hosts: HostSet, client: int | None, server: int) -> list[float]:
    """Five 1-byte TCP round trips from host `client` (None: this namespace) to host `server`."""
    server_ns, address = hosts.hosts[server - 1]
    echo = subprocess.Popen([*in_namespace(server_ns), sys.executable, "-c", ECHO, address, str(PORT)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "listening"
        client_ns = None if client is None else hosts.namespace(client)
        out = subprocess.run([*in_namespace(client_ns), sys.executable, "-c", PING, address, str(PORT)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return [float(line) for line in out.split()]
    finally:
        echo.kill()
        echo.wait()


def test_hosts_reach_each_other_and_down_removes_everything(netns_hosts: MakeHosts) -> None:
    hosts = netns_hosts(3, emulator="none")
    for ns, address in hosts.hosts:
        assert f"inet {address}/24" in run("ip", "-n", ns, "addr", "show", "dev", "eth0").stdout
    assert len(round_trips_ms(hosts, 1, 3)) == 5 and len(round_trips_ms(hosts, None, 2)) == 5
    assert load(hosts.prefix) == hosts
    removed = down(hosts.prefix)
    assert set(hosts.namespace(k) for k in (1, 2, 3)) <= set(removed)
    assert hosts.prefix not in run("ip", "netns", "list").stdout and load(hosts.prefix) is None
    assert down(hosts.prefix) == []  # idempotent


def test_wire_holds_each_direction_for_the_delay(netns_hosts: MakeHosts) -> None:
    hosts = netns_hosts(2, LinkConditions(delay_ms=25.0), emulator="wire")
    assert hosts.emulator == "wire" and hosts.wire_pid is not None
    assert "dev wire0" in run("ip", "-n", hosts.namespace(1), "route", "get", hosts.address(2)).stdout
    assert min(round_trips_ms(hosts, 1, 2)) >= 2 * 25.0
    set_conditions(LinkConditions(delay_ms=60.0), hosts.prefix)  # returns once the emulator took it
    assert min(round_trips_ms(hosts, 2, 1)) >= 2 * 60.0
    assert "dev eth0" in run("ip", "-n", hosts.namespace(1), "route", "get", hosts.gateway).stdout  # not delayed


def test_rate_limit_is_a_tbf_on_each_hosts_egress(netns_hosts: MakeHosts) -> None:
    hosts = netns_hosts(2, LinkConditions(delay_ms=1.0, rate_mbit=10.0))
    dev = "wire0" if hosts.emulator == "wire" else "eth0"
    for ns, _ in hosts.hosts:
        assert "rate 10Mbit" in run("tc", "-n", ns, "qdisc", "show", "dev", dev).stdout
    set_conditions(LinkConditions(delay_ms=1.0), hosts.prefix)
    assert "tbf" not in run("tc", "-n", hosts.namespace(1), "qdisc", "show", "dev", dev).stdout


def test_loss_without_netem_is_skipped_with_the_reason(netns_hosts: MakeHosts) -> None:
    if netem_available():
        pytest.skip("this kernel has netem: loss is applied, not skipped")
    hosts = netns_hosts(2, LinkConditions(delay_ms=5.0, loss_pct=1.0))
    assert hosts.emulator == "wire"
    assert any(note.startswith("loss 1 % skipped: loss needs netem") for note in hosts.notes), hosts.notes
    with pytest.raises(NetnsError, match="no netem"):
        netns_hosts(2, LinkConditions(delay_ms=5.0), emulator="netem")


def test_netem_carries_delay_jitter_and_loss(netns_hosts: MakeHosts) -> None:
    if not netem_available():
        pytest.skip("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): the userspace wire is used instead")
    hosts = netns_hosts(2, LinkConditions(delay_ms=25.0, jitter_ms=1.0, loss_pct=1.0, rate_mbit=50.0))
    qdiscs = run("tc", "-n", hosts.namespace(1), "qdisc", "show", "dev", "eth0").stdout
    assert hosts.emulator == "netem" and "netem" in qdiscs and "loss 1%" in qdiscs and "rate 50Mbit" in qdiscs
    assert min(round_trips_ms(hosts, 1, 2)) >= 2 * 24.0


def test_a_stage_starts_in_the_namespace_owning_its_address(netns_hosts: MakeHosts) -> None:
    hosts = netns_hosts(2, emulator="none")
    assert namespace_of(hosts.address(2)) == hosts.namespace(2)
    assert stage_command_prefix(f"tcp://{hosts.address(1)}:19400") == ["ip", "netns", "exec", hosts.namespace(1)]
    assert stage_command_prefix("ipc:///tmp/x/stage0.sock", hosts.address(2)) == ["ip", "netns", "exec", hosts.namespace(2)]
    assert stage_command_prefix(f"tcp://{hosts.gateway}:19400") == []  # this namespace's own address
    assert stage_command_prefix("tcp://127.0.0.1:19400") == [] and stage_command_prefix("ipc:///tmp/s", "127.0.0.1") == []
    assert stage_command_prefix("tcp://10.255.255.254:1") == []  # nobody's: the stage fails to bind, naming it


def test_up_refuses_a_second_set_and_bad_names_and_cleans_up_a_failed_start(netns_hosts: MakeHosts,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = netns_hosts(1, emulator="none")
    with pytest.raises(NetnsError, match="already up"):
        up(1, prefix=hosts.prefix, subnet="10.77.99")
    with pytest.raises(NetnsError, match="prefix of 1-8"):
        up(1, prefix="Bad-Name")

    def broken(_hosts: HostSet) -> None:
        raise NetnsError("tc exploded")

    monkeypatch.setattr("skippy.netns.hosts._apply_qdiscs", broken)
    failed = f"{hosts.prefix}x"
    head, last = hosts.subnet.rsplit(".", 1)
    try:
        with pytest.raises(NetnsError, match="tc exploded"):
            up(2, LinkConditions(delay_ms=5.0), prefix=failed, subnet=f"{head}.{int(last) ^ 1}", emulator="wire")
        assert f"{failed}-" not in run("ip", "netns", "list").stdout + run("ip", "-o", "link", "show").stdout
        assert load(failed) is None
    finally:
        down(failed)


def test_cli_up_status_down(netns_ok: None, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, subnet = f"c{os.getpid() % 100000:05d}", f"10.77.{random.Random(os.getpid()).randrange(100, 250)}"
    try:
        assert netns_hosts_cli(["up", "2", "--prefix", prefix, "--subnet", subnet, "--delay-ms", "5",
                                "--loss-pct", "2"]) == 0
        out = capsys.readouterr().out
        assert f"{prefix}-h2" in out and f"{subnet}.2" in out and "emulator" in out
        assert ("loss 2 % skipped" in out) != netem_available()
        assert netns_hosts_cli(["status", "--prefix", prefix]) == 0 and f"{subnet}.1" in capsys.readouterr().out
    finally:
        assert netns_hosts_cli(["down", "--prefix", prefix]) == 0
    assert netns_hosts_cli(["down", "--prefix", prefix]) == 0 and "nothing to remove" in capsys.readouterr().out


def test_without_root_or_iproute2_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = unavailable_reason.__wrapped__  # the uncached check
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in probe()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    assert probe() == "ip and tc not found (install iproute2)"
