"""CPU time a server's processes spend per output token, by role, for benchmarks on a shared machine.

Wall-clock tok/s on a machine shared with other work moves by up to 2x between runs; the CPU seconds a
server's own processes use for a level's tokens move far less, and say where the work goes: for `skippy
up` the stages (`stage:stage0`, `stage:stage1`, ...), the `broker` and the `adapter`; for llama-server its
one process. `snapshot(pid)` sums user + system time (from /proc) of a process and its descendants by
role; `per_token_ms(before, after, tokens)` is each role's share of a level's tokens, plus `total`.
Processes that start or end between two snapshots count only while both saw them (none do during a level).
CPU time is work only where nothing spins: skippy sets OMP_WAIT_POLICY=active, so a stage with more than
one llama.cpp thread also counts its OpenMP workers' spin-waits between decodes (one thread per stage, as
`--stage-cpus 0,1` gives, spins nothing; llama-server with `-t 1` neither).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["per_token_ms", "role", "snapshot"]

_TICKS = os.sysconf("SC_CLK_TCK")


def role(cmdline: Sequence[str]) -> str:
    """What a process is, from its argv: `skippy <cmd>` (stage: its config's stem), else the program's name."""
    if not cmdline:
        return "?"
    args = list(cmdline)
    for i, arg in enumerate(args[:-1]):
        if arg in ("skippy.cli.main", "skippy") or arg.endswith("/skippy"):
            command = args[i + 1]
            if command == "stage" and "--config" in args[:-1]:
                return "stage:" + Path(args[args.index("--config") + 1]).stem.split(".")[0]
            return command
    if Path(args[0]).name == "skippy" and len(args) > 1:
        return args[1]
    return Path(args[0]).name


def _processes() -> dict[int, tuple[int, float, list[str]]]:
    """pid -> (parent pid, CPU seconds used, argv) of every readable process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid ... utime stime
        found[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, [a for a in argv if a])
    return found


def snapshot(root_pid: int) -> dict[str, float]:
    """CPU seconds used so far by `root_pid` and every descendant, summed by role."""
    procs = _processes()
    tree, grew = {root_pid}, True
    while grew:
        grew = False
        for pid, (parent, _, _) in procs.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    used: dict[str, float] = {}
    for pid in tree & procs.keys():
        name = role(procs[pid][2])
        used[name] = used.get(name, 0.0) + procs[pid][1]
    return used


def per_token_ms(before: dict[str, float], after: dict[str, float], tokens: int) -> dict[str, float]:
    """Each role's CPU ms per token between two snapshots (roles seen in both), and their `total`."""
    if tokens <= 0:
        return {}
    shares = {name: (after[name] - before[name]) * 1e3 / tokens for name in after if name in before}
    shares = {name: round(ms, 3) for name, ms in sorted(shares.items())}
    return {**shares, "total": round(sum(shares.values()), 3)}
