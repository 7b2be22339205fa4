"""Fixtures for tests on namespace hosts: a fresh host set per call, always removed at teardown.

`netns_hosts(count, conditions, emulator=...)` makes a set with its own prefix and subnet (so tests
and other runs on the machine never collide) and removes it after the test, pass or fail; the
teardown then checks that none of its namespaces, links, memory cgroups or emulator processes is left. When this
machine cannot make namespaces (not root, no iproute2) every test here skips, naming the reason.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_helpers import MakeHosts

from skippy.netns import HostSet, LinkConditions, NetnsError, down, unavailable_reason, up
from skippy.netns.commands import run
from skippy.netns.hosts import state_path


@pytest.fixture(scope="session")
def netns_ok() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")


@pytest.fixture
def netns_hosts(netns_ok: None) -> Iterator[MakeHosts]:
    made: list[str] = []
    rng = random.Random(os.getpid() * 1000 + id(made) % 1000)

    def make(count: int, conditions: LinkConditions | None = None, *, emulator: str = "auto",
             mem_mb: float | None = None) -> HostSet:
        for _ in range(20):  # another run may hold the subnet picked: try another
            prefix = f"t{os.getpid() % 100000:05d}{len(made)}"
            subnet = f"10.77.{rng.randrange(100, 250)}"
            made.append(prefix)
            try:
                return up(count, conditions or LinkConditions(), prefix=prefix, subnet=subnet, emulator=emulator,
                          mem_mb=mem_mb)
            except NetnsError as exc:
                if "already in use" not in str(exc):
                    raise
        raise NetnsError("no free 10.77.x subnet found")

    yield make
    left = []
    for prefix in made:
        down(prefix)
        names = run("ip", "netns", "list").stdout + run("ip", "-o", "link", "show").stdout
        cgroups = list(Path("/sys/fs/cgroup").glob(f"*/skippy-netns/{prefix}-h*"))
        if f"{prefix}-" in names or state_path(prefix).exists() or cgroups:
            left.append(prefix)
    assert not left, f"host sets not fully removed: {left}"
