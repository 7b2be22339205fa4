"""Which network namespace owns an address, and the command prefix that starts a stage inside it.

`skippy up --topology T` (through `skippy.launcher`) starts every stage with
`stage_command_prefix(endpoint, host)`: empty when the stage's address is local here (loopback,
ipc://, an address of this namespace) or assigned nowhere, else ``ip netns exec <namespace>``
for the named namespace (``ip netns list``) that has the address on one of its interfaces, entered
from inside the host's memory cgroup when it has one (`scripts/netns-hosts up --mem-mb`).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from skippy.netns.cgroups import join_prefix

_NETNS_DIR = Path("/run/netns")


def _local_here(address: str) -> bool:
    """Whether this namespace can bind ``address`` (it is one of its own)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def _addresses(namespace: str) -> set[str]:
    proc = subprocess.run(["ip", "-n", namespace, "-j", "addr", "show"], capture_output=True, text=True)
    if proc.returncode != 0:
        return set()
    return {info["local"] for link in json.loads(proc.stdout or "[]") for info in link.get("addr_info", [])
            if "local" in info}


def namespace_of(address: str) -> str | None:
    """The named namespace whose interfaces have ``address`` (None: it is local here, or nowhere, or not an IP)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    if ip.is_loopback or ip.is_unspecified or _local_here(str(ip)) or not _NETNS_DIR.is_dir():
        return None
    for namespace in sorted(p.name for p in _NETNS_DIR.iterdir()):
        if str(ip) in _addresses(namespace):
            return namespace
    return None


def stage_command_prefix(endpoint: str, host: str | None = None) -> list[str]:
    """``["ip", "netns", "exec", NS]`` when the stage's address (its tcp:// endpoint's host, else
    ``host``) belongs to namespace NS; ``[]`` when the stage runs here."""
    address = stage_address(endpoint, host)
    namespace = namespace_of(address) if address else None
    return [*join_prefix(namespace), "ip", "netns", "exec", namespace] if namespace else []


def stage_address(endpoint: str, host: str | None = None) -> str | None:
    """The stage's address: its tcp:// endpoint's host, else ``host`` (None for an ipc:// stage without one)."""
    parts = urlsplit(endpoint)
    return parts.hostname if parts.scheme == "tcp" else host
