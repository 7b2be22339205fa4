"""CPU affinity flags: `--cpu-affinity` and `--stage-cpus` parsed, checked and resolved per stage; CPU
lists in the kernel's syntax; `stage_groups` (stages that can compute at once without sharing a core)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_helpers import Serve, ServeError

from skippy.config import StageTopology
from skippy.config.cpu_sets import format_cpu_list, parse_cpu_list, stage_groups, stages_sharing_cores

CPUS = os.cpu_count() or 1


@pytest.mark.parametrize(("text", "cpus", "canonical"), [
    ("0", (0,), "0"), ("0-3", (0, 1, 2, 3), "0-3"), ("3,0-1", (0, 1, 3), "0-1,3"), (" 2 , 2 ", (2,), "2"),
])
def test_cpu_lists_round_trip(text: str, cpus: tuple[int, ...], canonical: str) -> None:
    assert parse_cpu_list(text) == cpus
    assert format_cpu_list(cpus) == canonical
    assert parse_cpu_list("+".join(text.split(",")), "+") == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "3-1", "0,,1", "0-1-2"])
def test_malformed_cpu_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_not_pinned_by_default(serve: Serve) -> None:
    options = serve()
    assert options.cpu_affinity == () and options.stage_cpus == ()


def test_cpu_affinity_pins_this_stage(serve: Serve) -> None:
    assert serve("--cpu-affinity", "0").cpu_affinity == (0,)
    assert serve("--cpu-affinity", f"0-{CPUS - 1}").cpu_affinity == tuple(range(CPUS))


def test_stage_cpus_picks_the_entry_of_this_stage(serve: Serve, write_json: Callable[[str, Any], Path],
                                                  make_topology: Callable[..., dict[str, Any]]) -> None:
    topology = write_json("topo.json", make_topology(2))
    options = serve("--stage-cpus", "0+0,0", "--topology", str(topology))
    assert options.cpu_affinity == (0,) and options.stage_cpus == ((0,), (0,))
    assert options.to_dict()["stage_cpus"] == [[0], [0]]


@pytest.mark.parametrize(("flags", "needle"), [
    (("--cpu-affinity", "x"), "--cpu-affinity must be a CPU list such as 0 or 0-3 or 0,2-3, got 'x'"),
    (("--cpu-affinity", str(CPUS)), f"--cpu-affinity names CPU {CPUS}, but this machine has CPUs 0-{CPUS - 1}"),
    (("--stage-cpus", "0,"), "--stage-cpus must be one CPU set per stage, separated by commas"),
    (("--stage-cpus", f"0,{CPUS}"), f"--stage-cpus names CPU {CPUS}"),
    (("--stage-cpus", "0", "--cpu-affinity", "0"), "--cpu-affinity and --stage-cpus both pin this stage"),
])
def test_bad_affinity_flags_are_one_line_errors(serve_error: ServeError, flags: tuple[str, ...], needle: str) -> None:
    assert needle in serve_error(*flags)


def test_stage_cpus_needs_one_set_per_stage(serve_error: ServeError, write_json: Callable[[str, Any], Path],
                                            make_topology: Callable[..., dict[str, Any]]) -> None:
    topology = write_json("topo.json", make_topology(2))
    message = serve_error("--stage-cpus", "0", "--topology", str(topology))
    assert message == "--stage-cpus must give one CPU set per stage (2 in topology 'topo-1'), got 1: '0'"
    assert "none for stage_index 1" in serve_error("--stage-cpus", "0", stage={"stage_index": 1, "upstream": {
        "stage_id": "stage-0", "stage_index": 0, "endpoint": "tcp://127.0.0.1:19000"}})


def test_stage_groups(make_topology: Callable[..., dict[str, Any]]) -> None:
    data = make_topology(3)
    topology = StageTopology.from_dict(data)
    assert stage_groups(None) == 1
    assert stage_groups(topology) == 1  # one host, unpinned: they share every core
    assert stage_groups(topology, [(0,), (1,), (2,)]) == 3
    assert stage_groups(topology, [(0,), (0, 1), (2,)]) == 2  # 0 and 1 overlap
    assert stage_groups(topology, [(0,), (1,), ()]) == 1  # an unpinned stage overlaps both
    hosts = StageTopology.from_dict({**data, "stages": [{**s, "host": f"h{i}"} for i, s in enumerate(data["stages"])]})
    assert stage_groups(hosts) == 3


def test_stages_sharing_cores() -> None:
    """Which stages started on this machine use a CPU another stage uses (their OpenMP spin, skippy.openmp)."""
    assert stages_sharing_cores(1) == (False,)  # one stage: alone, whatever its CPUs
    assert stages_sharing_cores(2) == (True, True)  # unpinned: every CPU each
    assert stages_sharing_cores(2, [(0,), (1,)]) == (False, False)
    assert stages_sharing_cores(3, [(0,), (1,), (0,)]) == (True, False, True)  # 3 stages on 2 cores
    assert stages_sharing_cores(2, [(0, 1), (1, 2)]) == (True, True)
    assert stages_sharing_cores(2, [(0,), ()]) == (True, True)  # an unpinned stage may run on CPU 0 too


def test_the_driver_keeps_one_micro_batch_per_group_of_pinned_stages(
        serve: Callable[..., Any], write_json: Callable[[str, Any], Path], make_topology: Callable[..., dict[str, Any]]) -> None:
    def micro_batches(*flags: str) -> int:  # what the driver keeps in flight
        options = serve("--topology", topology, *flags)
        return stage_groups(options.topology, options.stage_cpus)

    topology = str(write_json("topo.json", make_topology(2)))
    assert micro_batches() == 1  # sharing every core: one batch in flight
    assert micro_batches("--stage-cpus", "0,1") == 2
    assert micro_batches("--stage-cpus", "0-1,1") == 1
