"""Memory budgets for namespace hosts: one memory cgroup per host, and reading a process's own limit.

`scripts/netns-hosts up N --mem-mb M` makes `<memory root>/skippy-netns/<namespace>` for each host with
a limit of M MiB (cgroup v1: memory.limit_in_bytes, and memory.memsw.limit_in_bytes where swap is
accounted; v2: memory.max with memory.swap.max 0). Page cache a host's processes fault in counts too,
as on a real machine, and is reclaimed first; what cannot be reclaimed past the limit is OOM-killed.
`join_prefix(namespace)` is the command prefix that puts a process in its host's cgroup before it
execs (`skippy.netns.owner` adds it when the host has one), passing the limit in $SKIPPY_MEMORY_LIMIT_BYTES.
`own_memory_limit()` is this process's limit: that variable, else the tightest limit over its cgroup and
their parents (None: unlimited), which a stage checks its predicted memory against before it loads.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from skippy.netns.commands import NetnsError

__all__ = ["LIMIT_ENV", "cgroup_dir", "join_prefix", "make_memory_cgroup", "memory_unavailable_reason", "own_memory_limit",
           "remove_memory_cgroups"]

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup")
_PARENT = "skippy-netns"
_UNLIMITED = 1 << 60
LIMIT_ENV = "SKIPPY_MEMORY_LIMIT_BYTES"  # a stage's memory limit, set by join_prefix


def _root() -> tuple[Path, int] | None:
    """(the memory hierarchy's mount, its version) or None when this machine has no memory controller."""
    if (_V1 / "memory.limit_in_bytes").exists():
        return _V1, 1
    controllers = _V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return _V2, 2
    return None


def memory_unavailable_reason() -> str | None:
    """Why hosts cannot get a memory budget here (None: they can)."""
    if _root() is None:
        return ("no memory cgroup controller (neither /sys/fs/cgroup/memory nor memory in"
                " /sys/fs/cgroup/cgroup.controllers)")
    return None


def cgroup_dir(namespace: str) -> Path | None:
    """The memory cgroup of namespace host `namespace`, if it has one."""
    root = _root()
    path = root[0] / _PARENT / namespace if root else None
    return path if path is not None and path.is_dir() else None


def make_memory_cgroup(namespace: str, mem_mb: float) -> Path:
    root = _root()
    if root is None:
        raise NetnsError(f"--mem-mb needs the memory cgroup controller: {memory_unavailable_reason()}")
    base, version = root
    parent = base / _PARENT
    parent.mkdir(exist_ok=True)
    if version == 2:
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text("+memory")
    path = parent / namespace
    path.mkdir(exist_ok=True)
    limit = str(int(mem_mb * (1 << 20)))
    if version == 1:
        (path / "memory.limit_in_bytes").write_text(limit)
        with contextlib.suppress(OSError):  # present only where swap is accounted
            (path / "memory.memsw.limit_in_bytes").write_text(limit)
    else:
        (path / "memory.max").write_text(limit)
        with contextlib.suppress(OSError):
            (path / "memory.swap.max").write_text("0")
    return path


def remove_memory_cgroups(prefix: str) -> list[str]:
    """Remove the cgroups of set `prefix`'s hosts (their processes must be gone); returns the names removed."""
    root = _root()
    parent = root[0] / _PARENT if root else None
    if parent is None or not parent.is_dir():
        return []
    removed = []
    for path in sorted(parent.glob(f"{prefix}-h*")):
        if re.fullmatch(rf"{re.escape(prefix)}-h\d+", path.name):
            with contextlib.suppress(OSError):
                path.rmdir()
                removed.append(path.name)
    with contextlib.suppress(OSError):
        parent.rmdir()  # only once it is empty
    return removed


def _limit_file(path: Path) -> Path:
    return path / ("memory.limit_in_bytes" if (path / "memory.limit_in_bytes").exists() else "memory.max")


def join_prefix(namespace: str) -> list[str]:
    """A command prefix that moves the process into the host's memory cgroup, then execs the rest with the
    limit in LIMIT_ENV (`ip netns exec` remounts /sys, so the process cannot read its cgroup there)."""
    path = cgroup_dir(namespace)
    if path is None:
        return []
    limit = _limit_file(path).read_text().strip()
    return ["sh", "-c", f'echo $$ > {path}/cgroup.procs && exec "$@"', "skippy-cgroup", "env", f"{LIMIT_ENV}={limit}"]


def own_memory_limit() -> int | None:
    """Bytes this process may use under its memory cgroup and their parents (None: no limit): LIMIT_ENV when
    its host's prefix set it, else read from the cgroup files."""
    given = os.environ.get(LIMIT_ENV, "")
    if given.isdigit():
        return int(given) if int(given) < _UNLIMITED else None
    root = _root()
    if root is None:
        return None
    base, version = root
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    relative = next((line.split(":", 2)[2] for line in lines
                     if (version == 1 and "memory" in line.split(":", 2)[1].split(",")) or
                     (version == 2 and line.startswith("0::"))), None)
    if relative is None:
        return None
    limits = []
    path = base / relative.lstrip("/")
    while True:
        with contextlib.suppress(OSError, ValueError):
            text = (path / ("memory.limit_in_bytes" if version == 1 else "memory.max")).read_text().strip()
            limits.append(_UNLIMITED if text == "max" else int(text))
        if path == base or base not in path.parents:
            break
        path = path.parent
    smallest = min(limits, default=_UNLIMITED)
    return None if smallest >= _UNLIMITED else smallest
