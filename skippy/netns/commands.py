"""Running `ip` / `tc`, and whether this machine can make namespace hosts at all (and has netem)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache


class NetnsError(RuntimeError):
    """A namespace operation failed; the message names the command and what it said."""


def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an `ip` / `tc` command; NetnsError with its stderr when it fails and ``check``."""
    proc = subprocess.run(list(args), input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@cache
def unavailable_reason() -> str | None:
    """Why namespace hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); this process is not root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (install iproute2)"
    probe = f"skprobe{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    run("ip", "netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return None


@cache
def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (tried in a throwaway namespace)."""
    probe = f"skprobe{os.getpid()}"
    run("ip", "netns", "add", probe)
    try:
        return run("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", check=False).returncode == 0
    finally:
        run("ip", "netns", "del", probe, check=False)


def received_bytes(namespace: str) -> int:
    """Bytes namespace `namespace` has received on all its links but loopback (its kernel's counters)."""
    links = json.loads(run("ip", "-n", namespace, "-j", "-s", "link", "show").stdout or "[]")
    return sum(int(link.get("stats64", {}).get("rx", {}).get("bytes", 0)) for link in links if link.get("ifname") != "lo")
