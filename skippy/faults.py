"""Failure injection for tests of failure handling: `SKIPPY_FAULT=point[,point...]` in a process's env.

A named point raises `InjectedFault` where the real failure would surface (a send that fails, a
scheduling step that raises), so tests see the process's real reaction: a log line naming the
cause, failed requests, a nonzero exit. Unset in normal runs; costs one set lookup per call.
"""

from __future__ import annotations

import os

POINTS = frozenset({"driver.launch", "link.batch", "stage.batch", "prefix.record"})
_ACTIVE = frozenset(p.strip() for p in os.environ.get("SKIPPY_FAULT", "").split(",") if p.strip())
if _ACTIVE - POINTS:
    raise RuntimeError(f"SKIPPY_FAULT names unknown points {sorted(_ACTIVE - POINTS)} (known: {sorted(POINTS)})")


class InjectedFault(RuntimeError):
    """Raised at a point named in SKIPPY_FAULT."""


def fault_point(name: str) -> None:
    if name in _ACTIVE:
        raise InjectedFault(f"injected fault at {name} (SKIPPY_FAULT)")


def fault_active(name: str) -> bool:
    """For a point whose failure is a silent loss, not a raise (`prefix.record`: a stage keeps no entry)."""
    return name in _ACTIVE
