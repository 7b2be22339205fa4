"""The hosts a plan may use: address, compute (a CPU set here, a speed, or a cost table measured there),
memory budget and the link each one sends on.

A hosts file is JSON: `{"hosts": [{"name": "h1", "address": "10.77.0.1", "cpus": "0", "mem_mb": 300,
"delay_ms": 20, "mbps": 1000}, ...]}` (or the list alone). Every field but `name` is optional:
`address` 127.0.0.1; `cpus` the CPU set of this machine the host stands for (calibrated on it, and
its stage pinned to it; default: every CPU); `speed` how many times as fast as that calibration
(default 1); `calibration` a cost table measured on the host itself (`python -m skippy.plan.calibrate
MODEL --out FILE` there); `mem_mb` its memory budget (default: unlimited); `delay_ms` and `mbps` the
one-way delay and rate of what it sends; `ssh` how `skippy up` reaches the host to start its stage there
(skippy.config.ssh_target; its `address` then defaults to the SSH host name, and every host of the file needs
an address the others reach, never loopback). The order is the pipeline's: stage 0 on the first host used.
`hosts_from_flags` makes the same from `--stage-cpus 0,1` (one host per CPU set, on loopback) and
`--host-mem-mb`, `--link-delay-ms`, `--link-mbps`; `netns_hosts` from a namespace host set
(`scripts/netns-hosts up`, `--netns PREFIX`).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, fields
from pathlib import Path

from skippy.config.errors import ConfigError
from skippy.config.ssh_target import SshTarget, parse_ssh_target

__all__ = ["Host", "hosts_from_flags", "load_hosts", "loopback_address", "netns_hosts"]


@dataclass(frozen=True)
class Host:
    name: str
    address: str = "127.0.0.1"
    cpus: str | None = None  # a CPU set of this machine ("0", "2-3"); None: every CPU
    speed: float = 1.0
    calibration: str | None = None  # a cost table measured on the host
    mem_mb: float | None = None
    delay_ms: float = 0.0
    mbps: float | None = None
    ssh: SshTarget | None = None  # started over SSH (skippy.remote); None: on this machine

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ConfigError("a host needs a name")
        if self.speed <= 0 or (self.mem_mb is not None and self.mem_mb <= 0) or self.delay_ms < 0 \
                or (self.mbps is not None and self.mbps <= 0):
            raise ConfigError(f"host {self.name}: speed, mem_mb and mbps must be > 0 and delay_ms >= 0")

    @property
    def mem_bytes(self) -> int | None:
        return None if self.mem_mb is None else int(self.mem_mb * (1 << 20))

    def describe(self) -> str:
        compute = f"CPUs {self.cpus or 'all'}" + (f" x{self.speed:g}" if self.speed != 1 else "")
        memory = f"{self.mem_mb:g} MiB" if self.mem_mb is not None else "no memory limit"
        link = f"{self.delay_ms:g} ms" + (f", {self.mbps:g} Mbit/s" if self.mbps else "")
        where = f", {self.ssh.describe()}" if self.ssh else ""
        return f"{self.name} ({self.address}{where}): {compute}, {memory}, link {link}"


def _host(entry: object, index: int, where: str) -> Host:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: hosts[{index}] must be an object, got {type(entry).__name__}")
    known = {f.name for f in fields(Host)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: hosts[{index}].{unknown[0]} is not a host field (known: {', '.join(sorted(known))})")
    data = {"name": f"h{index + 1}", **entry}
    if data.get("cpus") is not None:
        data["cpus"] = str(data["cpus"])
    if data.get("ssh") is not None:
        data["ssh"] = parse_ssh_target(data["ssh"], f"{where}: hosts[{index}].ssh")
        data.setdefault("address", data["ssh"].hostname)
    try:
        return Host(**data)
    except TypeError as error:
        raise ConfigError(f"{where}: hosts[{index}]: {error}") from None


def load_hosts(path: Path) -> list[Host]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"hosts file {path}: {error}") from None
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"hosts file {path}: needs a non-empty list of hosts (or {{\"hosts\": [...]}})")
    hosts = [_host(entry, i, str(path)) for i, entry in enumerate(entries)]
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise ConfigError(f"hosts file {path}: host names must be distinct, got {names}")
    local = [h for h in hosts if loopback_address(h.address)]
    if local and any(h.ssh for h in hosts):
        raise ConfigError(f"hosts file {path}: {local[0].name}'s address {local[0].address} is loopback, but stages on"
                          " ssh hosts must reach every stage: give each host the address the others reach it at")
    return hosts


def loopback_address(address: str) -> bool:
    """Whether an address stays on its own machine (a loopback IP, or localhost)."""
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address == "localhost"


def hosts_from_flags(stage_cpus: str | None, mem_mb: float | None = None, delay_ms: float = 0.0,
                     mbps: float | None = None) -> list[Host]:
    """One loopback host per `--stage-cpus` entry ("0,1", "0-1,2+3"); one unpinned host without it."""
    sets: list[str | None] = [*_cpu_sets(stage_cpus)] or [None]
    return [Host(name=f"cpus{cpus}" if cpus else "host", cpus=cpus, mem_mb=mem_mb, delay_ms=delay_ms, mbps=mbps)
            for cpus in sets]


def _cpu_sets(stage_cpus: str | None) -> list[str]:
    """`--stage-cpus` "0-1,2+3" -> ["0-1", "2,3"] (one CPU set per stage); [] without it."""
    return [part.replace("+", ",") for part in stage_cpus.split(",")] if stage_cpus else []


def netns_hosts(prefix: str, stage_cpus: str | None) -> list[Host]:
    """The hosts of namespace host set `prefix`: its addresses, link conditions and memory budget, paired in order
    with the CPU sets of `stage_cpus` ("0,1")."""
    from skippy.netns import load  # noqa: PLC0415

    found = load(prefix)
    if found is None:
        raise ConfigError(f"--netns {prefix}: no such host set is up (scripts/netns-hosts up N --prefix {prefix})")
    cpus = _cpu_sets(stage_cpus)
    if cpus and len(cpus) != found.count:
        raise ConfigError(f"--stage-cpus gives {len(cpus)} CPU sets for the {found.count} hosts of {prefix}")
    c = found.conditions
    return [Host(name=ns, address=address, cpus=cpus[i] if cpus else None, mem_mb=found.mem_mb,
                 delay_ms=c.delay_ms, mbps=c.rate_mbit) for i, (ns, address) in enumerate(found.hosts)]
