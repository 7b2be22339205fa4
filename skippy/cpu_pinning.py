"""Pin this process to a set of CPUs (every one of its threads), and read any process's allowed CPUs.

`os.sched_setaffinity(0, ...)` moves only the calling thread; threads that already exist (numpy's
BLAS pool, ZeroMQ's I/O threads) keep their mask. `pin_process` therefore sets the mask of every task
in /proc/self/task (threads started later inherit it) and checks the result, so llama.cpp's threads,
created after it, and its default thread count (`len(os.sched_getaffinity(0))`) follow the set.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from skippy.config import ConfigError
from skippy.config.cpu_sets import format_cpu_list, parse_cpu_list

__all__ = ["allowed_cpus", "pin_process"]


def _tasks() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def pin_process(cpus: Sequence[int]) -> tuple[int, ...]:
    """Restrict every thread of this process to `cpus`; returns the allowed set (== `cpus`, else ConfigError)."""
    wanted = frozenset(cpus)
    done: set[int] = set()
    try:
        while todo := _tasks() - done:  # again if a thread was started meanwhile
            for tid in todo:
                try:
                    os.sched_setaffinity(tid, wanted)
                except ProcessLookupError:  # the thread ended
                    pass
            done |= todo
    except OSError as error:
        raise ConfigError(f"cannot pin this process to CPUs {format_cpu_list(sorted(wanted))}: {error}") from None
    got = frozenset(os.sched_getaffinity(0))
    if got != wanted:
        raise ConfigError(f"pinning this process to CPUs {format_cpu_list(sorted(wanted))}: the kernel allowed only"
                          f" {format_cpu_list(sorted(got))} (a cpuset or container limit?)")
    return tuple(sorted(got))


def allowed_cpus(pid: int | str = "self") -> tuple[int, ...]:
    """The CPUs a process may run on, from /proc/<pid>/status (Cpus_allowed_list)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Cpus_allowed_list:"):
                return parse_cpu_list(line.split(":", 1)[1])
    raise ValueError(f"/proc/{pid}/status has no Cpus_allowed_list")
