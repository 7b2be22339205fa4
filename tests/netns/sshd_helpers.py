"""Namespace hosts reached over SSH: Debian's OpenSSH server in each, with keys made for the test.

`sshd_hosts(hosts, root)` starts `/usr/sbin/sshd -D` inside each namespace host (and its memory cgroup, if it
has one) on a high port with its own host key, and makes a client identity and a known_hosts file naming each
host's key; it yields `SshHost`s (each with a cache directory of its own, its `SKIPPY_CACHE_DIR` there) and
stops every sshd afterwards. `SshHost.entry` is a hosts-file entry reaching one over SSH with this checkout's
Python. `namespace_processes` lists what runs inside a namespace, the sshd listener aside; `stage_processes` the
stages there, and `wait_empty` waits (bounded) until nothing but the listener is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from skippy.netns import HostSet
from skippy.netns.cgroups import join_prefix

SSHD = Path("/usr/sbin/sshd")
PORT = 22022
READY_TIMEOUT_S = 30.0
GONE_TIMEOUT_S = 30.0


def sshd_missing() -> str | None:
    """Why this machine cannot run the test's sshd (None: it can)."""
    if not SSHD.exists():
        return f"{SSHD} is missing (apt-get install -y openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client (ssh, ssh-keygen) is missing (apt-get install -y openssh-client)"
    return None


@dataclass
class SshHost:
    namespace: str
    address: str
    port: int
    cache_dir: Path
    identity: Path
    known_hosts: Path
    sshd: subprocess.Popen[bytes]

    def entry(self, name: str, **ssh: Any) -> dict[str, Any]:
        """A hosts-file entry for this host reached over SSH, this checkout's Python there."""
        return {"name": name, "address": self.address,
                "ssh": {"destination": f"root@{self.address}", "port": self.port, "identity_file": str(self.identity),
                        "known_hosts_file": str(self.known_hosts), "python": sys.executable,
                        "cache_dir": str(self.cache_dir), **ssh}}


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _start_sshd(namespace: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """sshd in the namespace, its stderr copied to `log`; returns once it says it listens."""
    proc = subprocess.Popen([*join_prefix(namespace), "ip", "netns", "exec", namespace, str(SSHD), "-D", "-e", "-f",
                             str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    listening = threading.Event()

    def copy() -> None:
        assert proc.stderr is not None
        with log.open("ab") as out:
            for line in proc.stderr:
                out.write(line)
                out.flush()
                if b"Server listening" in line:
                    listening.set()
        listening.set()  # it exited

    threading.Thread(target=copy, daemon=True).start()
    if not listening.wait(READY_TIMEOUT_S) or proc.poll() is not None:
        proc.kill()
        proc.wait(5)
        pytest.fail(f"sshd in {namespace} did not start listening: {log.read_text(errors='replace')}")
    return proc


@contextmanager
def sshd_hosts(hosts: HostSet, root: Path) -> Iterator[list[SshHost]]:
    if (reason := sshd_missing()) is not None:
        pytest.skip(reason)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    root.mkdir(parents=True, exist_ok=True)
    identity = root / "id_ed25519"
    authorized = root / "authorized_keys"
    authorized.write_text(_keygen(identity) + "\n")
    known_hosts = root / "known_hosts"
    made: list[SshHost] = []
    try:
        for namespace, address in hosts.hosts:
            home = root / namespace
            home.mkdir()
            host_key = _keygen(home / "host_ed25519")
            with known_hosts.open("a") as known:
                known.write(f"[{address}]:{PORT} {host_key}\n")
            config = home / "sshd_config"
            config.write_text("\n".join([
                f"ListenAddress {address}:{PORT}", f"HostKey {home / 'host_ed25519'}", f"AuthorizedKeysFile {authorized}",
                "PidFile none", "UsePAM no", "StrictModes no", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "PrintMotd no", ""]))
            made.append(SshHost(namespace, address, PORT, home / "cache", identity, known_hosts,
                                _start_sshd(namespace, config, home / "sshd.log")))
        yield made
    finally:
        for host in made:
            host.sshd.send_signal(signal.SIGTERM)
            host.sshd.wait(10)


def namespace_processes(namespace: str, but: int | None = None) -> list[str]:
    """`pid cmdline` of every process in network namespace `namespace` except pid `but` and its sshd listener."""
    inode = os.stat(f"/run/netns/{namespace}").st_ino
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == but:
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino != inode:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        found.append(f"{entry.name} {cmdline}")
    return found


def stage_processes(host: SshHost) -> list[tuple[int, str]]:
    found = [line.split(" ", 1) for line in namespace_processes(host.namespace, but=host.sshd.pid)]
    return [(int(pid), cmdline) for pid, cmdline in found if "skippy.cli.main stage" in cmdline]


def wait_empty(host: SshHost) -> list[str]:
    """Bounded wait for the host's sshd session processes to follow the stages out; what is left."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := namespace_processes(host.namespace, but=host.sshd.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval of a bounded wait
    return left
