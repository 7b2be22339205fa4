"""Create, change and remove a set of namespace hosts (see the package docstring for the layout).

A set is named by its ``prefix`` and recorded in ``/run/skippy-netns/<prefix>.json`` (a `HostSet`),
which the link emulator reads and `down` uses. `up` undoes what it did if any step fails; `down`
removes whatever of a set exists (namespaces, root-side links, the emulator process, the record),
so it is idempotent and also cleans up after a crash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from skippy.netns.cgroups import make_memory_cgroup, remove_memory_cgroups
from skippy.netns.commands import NetnsError, netem_available, run, unavailable_reason

STATE_DIR = Path("/run/skippy-netns")
EMULATORS = ("auto", "netem", "wire", "none")
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_SUBNET = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")
_WIRE_READY_S = 10.0


@dataclass(frozen=True)
class LinkConditions:
    """What each host's traffic to the other hosts goes through."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float | None = None

    def __post_init__(self) -> None:
        values = {"delay_ms": self.delay_ms, "jitter_ms": self.jitter_ms, "loss_pct": self.loss_pct}
        bad = [f"{name} {value}" for name, value in values.items() if not 0 <= value < 1e6]
        if self.loss_pct > 100 or (self.rate_mbit is not None and not 0 < self.rate_mbit < 1e6):
            bad.append(f"loss_pct {self.loss_pct} / rate_mbit {self.rate_mbit}")
        if bad:
            raise NetnsError(f"bad link conditions: {', '.join(bad)}")

    def describe(self) -> str:
        rate = f"{self.rate_mbit:g} Mbit/s" if self.rate_mbit else "unlimited"
        return f"delay {self.delay_ms:g} ms, jitter {self.jitter_ms:g} ms, loss {self.loss_pct:g} %, rate {rate}"


@dataclass(frozen=True)
class HostSet:
    """One set of hosts: ``<prefix>-h<k>`` at ``<subnet>.<k>``, k = 1..count."""

    prefix: str
    subnet: str
    count: int
    emulator: str  # netem | wire | none
    conditions: LinkConditions = field(default_factory=LinkConditions)
    notes: tuple[str, ...] = ()
    wire_pid: int | None = None
    revision: int = 0  # bumped by every change the emulator must pick up
    mem_mb: float | None = None  # each host's memory budget (a memory cgroup, skippy.netns.cgroups)

    def namespace(self, k: int) -> str:
        return f"{self.prefix}-h{k}"

    def address(self, k: int) -> str:
        return f"{self.subnet}.{k}"

    @property
    def hosts(self) -> list[tuple[str, str]]:
        """(namespace, address) of every host, in order."""
        return [(self.namespace(k), self.address(k)) for k in range(1, self.count + 1)]

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge."""
        return f"{self.subnet}.254"


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def ack_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.wire-ack"


def wire_log_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.wire.log"


def load(prefix: str = "skippy") -> HostSet | None:
    """The recorded set named ``prefix`` (None: none is up)."""
    try:
        data = json.loads(state_path(prefix).read_text())
    except FileNotFoundError:
        return None
    data["conditions"] = LinkConditions(**data["conditions"])
    data["notes"] = tuple(data["notes"])
    return HostSet(**data)


def _save(hosts: HostSet) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = state_path(hosts.prefix).with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(hosts), indent=2))
    tmp.replace(state_path(hosts.prefix))


def _choose_emulator(emulator: str, conditions: LinkConditions) -> tuple[str, list[str]]:
    """(emulator to use, notes saying why and what is skipped)."""
    if emulator not in EMULATORS:
        raise NetnsError(f"emulator must be one of {', '.join(EMULATORS)}, got {emulator!r}")
    has_netem = netem_available()
    if emulator == "netem" and not has_netem:
        raise NetnsError("emulator netem asked for, but this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM)")
    if emulator == "auto":
        emulator = "netem" if has_netem else "wire" if conditions.delay_ms or conditions.jitter_ms else "none"
    notes = [{"netem": "delay, jitter and loss: netem on each host's egress",
              "wire": "delay and jitter: the userspace link emulator (skippy.netns.wire); this kernel has no netem"
              if not has_netem else "delay and jitter: the userspace link emulator (skippy.netns.wire), as asked",
              "none": "no delay emulator (no delay or jitter asked for)"}[emulator]]
    if conditions.loss_pct and emulator != "netem":
        notes.append(f"loss {conditions.loss_pct:g} % skipped: loss needs netem, which this set does not use"
                     + ("" if has_netem else " (this kernel has no netem)"))
    return emulator, notes


def up(count: int, conditions: LinkConditions = LinkConditions(), *, prefix: str = "skippy", subnet: str = "10.77.0",
       emulator: str = "auto", mem_mb: float | None = None) -> HostSet:
    """Make ``count`` hosts with ``conditions`` (and ``mem_mb`` MiB of memory each); refuses if the set (or its
    subnet) is already up."""
    problem = unavailable_reason()
    if problem:
        raise NetnsError(problem)
    match = _SUBNET.match(subnet)
    if not _PREFIX.match(prefix) or not match or any(int(x) > 255 for x in match.groups()) or not 1 <= count <= 200:
        raise NetnsError(f"need a prefix of 1-8 [a-z0-9] starting with a letter, a subnet like 10.77.0 and 1..200 hosts;"
                         f" got {prefix!r}, {subnet!r}, {count}")
    if load(prefix) is not None or _namespaces(prefix):
        raise NetnsError(f"host set {prefix!r} is already up (scripts/netns-hosts down --prefix {prefix})")
    if re.search(rf"inet {re.escape(subnet)}\.", run("ip", "-4", "-o", "addr", "show").stdout):
        raise NetnsError(f"subnet {subnet}.0/24 is already in use in this namespace")
    if mem_mb is not None and not 0 < mem_mb < 1e9:
        raise NetnsError(f"--mem-mb must be > 0, got {mem_mb:g}")
    mode, notes = _choose_emulator(emulator, conditions)
    if mem_mb is not None:
        notes.append(f"memory: {mem_mb:g} MiB per host (a memory cgroup each)")
    hosts = HostSet(prefix, subnet, count, mode, conditions, tuple(notes), mem_mb=mem_mb)
    try:
        _make_bridge(hosts)
        for k in range(1, count + 1):
            _make_host(hosts, k)
            if mem_mb is not None:
                make_memory_cgroup(hosts.namespace(k), mem_mb)
        _save(hosts)
        if mode == "wire":
            hosts = _start_wire(hosts)
        _apply_qdiscs(hosts)
    except BaseException:
        down(prefix)
        raise
    return hosts


def _make_bridge(hosts: HostSet) -> None:
    br = f"{hosts.prefix}-br"
    run("ip", "-batch", "-", stdin=f"link add {br} type bridge\naddr add {hosts.gateway}/24 dev {br}\nlink set {br} up\n")


def _make_host(hosts: HostSet, k: int) -> None:
    ns, veth = hosts.namespace(k), f"{hosts.prefix}-v{k}"
    run("ip", "netns", "add", ns)
    run("ip", "-batch", "-", stdin=f"link add {veth} type veth peer name eth0 netns {ns}\n"
                                   f"link set {veth} master {hosts.prefix}-br up\n")
    lines = [f"addr add {hosts.address(k)}/24 dev eth0", "link set eth0 up", "link set lo up"]
    if hosts.emulator == "wire":  # other hosts via the tun, whose reader is the emulator
        lines += ["tuntap add dev wire0 mode tun", "link set wire0 mtu 1500 txqueuelen 10000 up"]
        lines += [f"route add {hosts.address(j)}/32 dev wire0 src {hosts.address(k)}"
                  for j in range(1, hosts.count + 1) if j != k]
    run("ip", "-n", ns, "-batch", "-", stdin="\n".join(lines) + "\n")


def _apply_qdiscs(hosts: HostSet) -> None:
    """Each host's egress qdiscs for the set's conditions (replacing what was there)."""
    c = hosts.conditions
    tbf = ["tbf", "rate", f"{c.rate_mbit:g}mbit", "burst", "64kb", "latency", "500ms"] if c.rate_mbit else []
    dev = "wire0" if hosts.emulator == "wire" else "eth0"
    for ns, _ in hosts.hosts:
        run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        if hosts.emulator == "netem":
            netem = ["netem", "delay", f"{c.delay_ms:g}ms", f"{c.jitter_ms:g}ms", "loss", f"{c.loss_pct:g}%"]
            run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *netem)
            if tbf:
                run("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
        elif tbf:
            run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)


def set_conditions(conditions: LinkConditions, prefix: str = "skippy") -> HostSet:
    """Change a running set's conditions; returns once they apply (the emulator acknowledged them)."""
    hosts = load(prefix)
    if hosts is None:
        raise NetnsError(f"host set {prefix!r} is not up")
    if hosts.emulator == "none" and (conditions.delay_ms or conditions.jitter_ms):
        raise NetnsError(f"host set {prefix!r} was made without a delay emulator; make it again with --delay-ms"
                         " or --emulator wire")
    notes = [n for n in hosts.notes if not n.startswith("loss")]
    if conditions.loss_pct and hosts.emulator != "netem":
        notes.append(f"loss {conditions.loss_pct:g} % skipped: loss needs netem, which this set does not use")
    hosts = dataclasses.replace(hosts, conditions=conditions, notes=tuple(notes), revision=hosts.revision + 1)
    _save(hosts)
    _apply_qdiscs(hosts)
    if hosts.emulator == "wire" and hosts.wire_pid is not None:
        os.kill(hosts.wire_pid, signal.SIGHUP)
        _await_ack(hosts)
    return hosts


def _start_wire(hosts: HostSet) -> HostSet:
    with wire_log_path(hosts.prefix).open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "skippy.netns.wire", str(state_path(hosts.prefix))],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    hosts = dataclasses.replace(hosts, wire_pid=proc.pid)
    _save(hosts)  # recorded before waiting, so down() finds it whatever happens next
    _await_ack(hosts, proc)
    return hosts


def _await_ack(hosts: HostSet, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + _WIRE_READY_S
    while time.monotonic() < deadline:
        try:
            if int(ack_path(hosts.prefix).read_text() or -1) == hosts.revision:
                return
        except (FileNotFoundError, ValueError):
            pass
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.02)
    tail = wire_log_path(hosts.prefix).read_text(errors="replace").strip().splitlines()[-3:]
    raise NetnsError(f"the link emulator did not take revision {hosts.revision} within {_WIRE_READY_S:g} s"
                     f" (log {wire_log_path(hosts.prefix)}): {' | '.join(tail)}")


def _namespaces(prefix: str) -> list[str]:
    names = [line.split()[0] for line in run("ip", "netns", "list").stdout.splitlines() if line.strip()]
    return [name for name in names if re.fullmatch(rf"{re.escape(prefix)}-h\d+", name)]


def _stop_wire(pid: int, prefix: str) -> None:
    """SIGTERM the set's emulator (only if that pid still is it), then SIGKILL if it lingers."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return
    if b"skippy.netns.wire" not in cmdline or str(state_path(prefix)).encode() not in cmdline:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        os.kill(pid, sig)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child (made in this process): reap it
                    return
            except ChildProcessError:
                if not Path(f"/proc/{pid}").exists():
                    return
            time.sleep(0.02)


def down(prefix: str = "skippy") -> list[str]:
    """Remove the set named ``prefix``, whatever of it exists; returns what was removed."""
    removed: list[str] = []
    hosts = load(prefix)
    if hosts is not None and hosts.wire_pid is not None:
        _stop_wire(hosts.wire_pid, prefix)
        removed.append(f"link emulator (pid {hosts.wire_pid})")
    for ns in _namespaces(prefix):
        run("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    removed += [f"memory cgroup {name}" for name in remove_memory_cgroups(prefix)]
    links = run("ip", "-o", "link", "show").stdout
    for name in re.findall(rf"^\d+: ({re.escape(prefix)}-(?:br|v\d+))[@:]", links, re.MULTILINE):
        run("ip", "link", "del", name, check=False)  # veths also vanish with their namespace, but lazily
        removed.append(name)
    for path in (state_path(prefix), ack_path(prefix), wire_log_path(prefix)):
        path.unlink(missing_ok=True)
    return removed


def all_prefixes() -> list[str]:
    """Prefixes of every recorded set."""
    return sorted(p.stem for p in STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []
