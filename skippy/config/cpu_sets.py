"""CPU affinity of stage processes: `--cpu-affinity CPUS` and `--stage-cpus LIST`, parsed and checked.

`--cpu-affinity` pins one stage to a CPU list in the kernel's (and `taskset -c`'s) syntax: `0`, `0-3`,
`0,2-3`. `--stage-cpus` pins every stage of a pipeline by its stage_index: one entry per stage, entries
separated by commas, each a CPU, a range `a-b`, or several of those joined by `+` (`0,1` puts stage 0 on
CPU 0 and stage 1 on CPU 1; `0-1,2+4` puts stage 0 on CPUs 0-1 and stage 1 on CPUs 2 and 4). Both are
stage flags, so `skippy up` hands them to every stage and each stage picks its own entry. A stage
applies its set at process start, before its model loads, so llama.cpp's default thread count (one per
allowed CPU) follows it. CPUs are checked against this machine's CPU count. `stage_groups` counts the
stages that can compute at the same time without sharing a core, for the driver's micro-batch depth;
`stages_sharing_cores` says which stages started on one machine use a CPU another one uses (their OpenMP spin).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from skippy.config.errors import ConfigError
from skippy.config.serving_args import FlagReader
from skippy.config.stage import StageConfig
from skippy.config.topology import StageTopology

__all__ = ["format_cpu_list", "parse_cpu_list", "resolve_affinity", "stage_groups", "stages_sharing_cores"]

CpuSet = tuple[int, ...]


def _cpus_in(part: str) -> range:
    low, sep, high = part.partition("-")
    if not low.strip().isdigit() or (sep and not high.strip().isdigit()):
        raise ValueError(part)
    first, last = int(low), int(high) if sep else int(low)
    if last < first:
        raise ValueError(part)
    return range(first, last + 1)


def parse_cpu_list(text: str, separator: str = ",") -> CpuSet:
    """`0,2-3` (or with `separator` "+": `0+2-3`) -> (0, 2, 3), sorted and unique; ValueError if malformed."""
    parts = text.strip().split(separator)
    if not text.strip() or any(not part.strip() for part in parts):
        raise ValueError(text)
    return tuple(sorted({cpu for part in parts for cpu in _cpus_in(part)}))


def format_cpu_list(cpus: Sequence[int]) -> str:
    """(0, 1, 2, 5) -> "0-2,5" (the form of /proc/<pid>/status Cpus_allowed_list)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(out) if ordered else ""


def _checked(flag: str, given: str, cpus: CpuSet) -> CpuSet:
    count = os.cpu_count() or 1
    missing = [cpu for cpu in cpus if cpu >= count]
    if missing:
        raise ConfigError(f"{flag} names CPU {missing[0]}, but this machine has CPUs 0-{count - 1}, got '{given}'")
    return cpus


def _cpu_flag(flags: FlagReader, flag: str) -> CpuSet | None:
    text = flags.text(flag)
    if text is None:
        return None
    try:
        cpus = parse_cpu_list(text)
    except ValueError:
        raise ConfigError(f"{flag} must be a CPU list such as 0 or 0-3 or 0,2-3, got '{text}'") from None
    return _checked(flag, text, cpus)


def _stage_cpus_flag(flags: FlagReader, topology: StageTopology | None) -> tuple[CpuSet, ...]:
    flag = "--stage-cpus"
    text = flags.text(flag)
    if text is None:
        return ()
    try:
        sets = tuple(parse_cpu_list(entry, "+") for entry in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} must be one CPU set per stage, separated by commas, each a CPU, a range a-b"
                          f" or several joined by + (e.g. 0,1 or 0-1,2+3), got '{text}'") from None
    for cpus in sets:
        _checked(flag, text, cpus)
    if topology is not None and len(sets) != len(topology.stages):
        raise ConfigError(f"{flag} must give one CPU set per stage ({len(topology.stages)} in topology"
                          f" '{topology.topology_id}'), got {len(sets)}: '{text}'")
    return sets


def resolve_affinity(flags: FlagReader, config: StageConfig, topology: StageTopology | None
                     ) -> tuple[CpuSet, tuple[CpuSet, ...]]:
    """(this stage's CPUs, () = not pinned; every stage's CPUs from --stage-cpus, () = not given)."""
    own = _cpu_flag(flags, "--cpu-affinity")
    stage_cpus = _stage_cpus_flag(flags, topology)
    if own is not None and stage_cpus:
        raise ConfigError("--cpu-affinity and --stage-cpus both pin this stage; give one of them")
    if stage_cpus and config.stage_index >= len(stage_cpus):
        raise ConfigError(f"--stage-cpus has {len(stage_cpus)} CPU sets, none for stage_index {config.stage_index}")
    return (own or (stage_cpus[config.stage_index] if stage_cpus else ())), stage_cpus


def _cpu_sets(n_stages: int, stage_cpus: Sequence[CpuSet]) -> list[frozenset[int]]:
    """Each stage's CPUs: its --stage-cpus entry, or every CPU of this machine when it is not pinned."""
    everything = frozenset(range(os.cpu_count() or 1))
    return [frozenset(stage_cpus[i]) if i < len(stage_cpus) and stage_cpus[i] else everything for i in range(n_stages)]


def stage_groups(topology: StageTopology | None, stage_cpus: Sequence[CpuSet] = ()) -> int:
    """How many groups of stages can compute at the same time without sharing a core: stages on distinct
    hosts never share; on one host, stages share when their CPU sets overlap (an unpinned stage overlaps
    every stage). One micro-batch in flight per group keeps every core busy without splitting any."""
    if topology is None:
        return 1
    groups: list[tuple[str, set[int]]] = []  # (host, union of its stages' CPUs)
    for stage, stage_set in zip(topology.stages, _cpu_sets(len(topology.stages), stage_cpus)):
        host = stage.host or stage.stage_id
        cpus = set(stage_set)
        overlapping = [g for g in groups if g[0] == host and g[1] & cpus]
        for group in overlapping:
            cpus |= group[1]
            groups.remove(group)
        groups.append((host, cpus))
    return len(groups)


def stages_sharing_cores(n_stages: int, stage_cpus: Sequence[CpuSet] = ()) -> tuple[bool, ...]:
    """Per stage of a pipeline started on this machine: does another stage use any of its CPUs? An unpinned
    stage may run on every CPU. Hosts do not count here (network namespaces on one machine share its cores)."""
    sets = _cpu_sets(n_stages, stage_cpus)
    return tuple(any(sets[i] & sets[j] for j in range(n_stages) if j != i) for i in range(n_stages))
