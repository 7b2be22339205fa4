"""The SSH tests' namespace hosts (skippy.netns.sshd), as the tests want them: skipped with the reason where this
machine has no OpenSSH server or client, failed with sshd's log where one does not start. `stage_processes` lists the
stages in a host; `wait_empty` waits (bounded) until nothing but its sshd listener is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from skippy.netns import HostSet
from skippy.netns import sshd as netns_sshd
from skippy.netns.sshd import SshHost, namespace_processes

__all__ = ["GONE_TIMEOUT_S", "SshHost", "cut_off", "namespace_processes", "sshd_hosts", "stage_processes", "wait_empty"]

GONE_TIMEOUT_S = 30.0


@contextmanager
def sshd_hosts(hosts: HostSet, root: Path) -> Iterator[list[SshHost]]:
    if (reason := netns_sshd.sshd_missing()) is not None:
        pytest.skip(reason)
    try:
        with netns_sshd.sshd_hosts(hosts, root) as made:
            yield made
    except netns_sshd.SshdError as error:
        pytest.fail(str(error))


def cut_off(host_set: HostSet, host: SshHost) -> None:
    """The host's link down, then every process in its namespace killed (its sshd too): it is gone."""
    netns_sshd.cut_off(host_set, host.namespace)
    host.sshd.wait(30)


def stage_processes(host: SshHost) -> list[tuple[int, str]]:
    found = [line.split(" ", 1) for line in namespace_processes(host.namespace, but=host.sshd.pid)]
    return [(int(pid), cmdline) for pid, cmdline in found if "skippy.cli.main stage" in cmdline]


def wait_empty(host: SshHost) -> list[str]:
    """Bounded wait for the host's sshd session processes to follow the stages out; what is left."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := namespace_processes(host.namespace, but=host.sshd.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval of a bounded wait
    return left
