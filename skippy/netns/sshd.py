"""Namespace hosts reached over SSH: Debian's OpenSSH server in each, with keys made for the occasion.

`sshd_hosts(hosts, root)` starts `/usr/sbin/sshd -D` inside each namespace host (and its memory cgroup, if it
has one) on a high port with its own host key, and makes a client identity and a known_hosts file naming each
host's key; it yields `SshHost`s (each with a cache directory of its own, its `SKIPPY_CACHE_DIR` there) and
stops every sshd afterwards. `SshHost.entry` is a hosts-file entry reaching one over SSH with this checkout's
Python. `namespace_processes` lists what runs inside a namespace; `cut_off` makes a host go away as a machine
does (its link down, then everything in it killed, its sshd too). Used by the SSH tests and `skippy bench hosts`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skippy.netns.cgroups import join_prefix
from skippy.netns.hosts import HostSet

__all__ = ["SSHD", "SshHost", "SshdError", "cut_off", "namespace_processes", "sshd_hosts", "sshd_missing"]

SSHD = Path("/usr/sbin/sshd")
PORT = 22022
READY_TIMEOUT_S = 30.0


class SshdError(RuntimeError):
    """An sshd inside a namespace host did not start; the message carries its log."""


def sshd_missing() -> str | None:
    """Why this machine cannot run an sshd per namespace host (None: it can)."""
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
        raise SshdError(f"sshd in {namespace} did not start listening: {log.read_text(errors='replace')}")
    return proc


@contextmanager
def sshd_hosts(hosts: HostSet, root: Path) -> Iterator[list[SshHost]]:
    """An sshd in each of `hosts`, keys and known_hosts under `root`; every sshd stopped on the way out."""
    if (reason := sshd_missing()) is not None:
        raise SshdError(reason)
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
            if host.sshd.poll() is None:
                host.sshd.send_signal(signal.SIGTERM)
            host.sshd.wait(10)


def namespace_processes(namespace: str, but: int | None = None) -> list[str]:
    """`pid cmdline` of every process in network namespace `namespace` except pid `but`."""
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


def cut_off(host_set: HostSet, namespace: str) -> None:
    """The host goes away as a machine does: its link down (the bridge drops what is sent to it), then every
    process in its namespace killed, its sshd too, so nothing of it answers and nothing of it is left."""
    k = [ns for ns, _ in host_set.hosts].index(namespace) + 1
    subprocess.run(["ip", "link", "set", f"{host_set.prefix}-v{k}", "down"], check=True)
    for line in namespace_processes(namespace):
        try:
            os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
