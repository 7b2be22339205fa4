"""Names the namespace-host tests share (conftest.py modules collide by name across test directories)."""

from __future__ import annotations

from collections.abc import Callable

from skippy.netns import HostSet

MakeHosts = Callable[..., HostSet]  # the `netns_hosts` fixture: make(count, conditions=None, *, emulator="auto", mem_mb=None)
