"""Chaos under load: 8 concurrent greedy streams against `skippy up` while each kind of process is killed
(SIGKILL) in turn: the middle stage of 3, the final stage, stage 0, the broker; `skippy up` restarts each.

Nothing is lost: every request completes (0 errored, 0 hung: when a later stage dies the requests in flight
pause and stage 0 replays them once the chain is back; when stage 0 or the broker dies the adapter resumes
them from the tokens it has sent), every completed stream's text is the same (the undisturbed run's:
they are one greedy request, served with `--deterministic`, where a request's tokens depend on nothing but
the request: docs/deterministic.md), requests complete again after each
restart without restarting the other stages, the survivors' resident memory stays flat, and no process of
the run is left after `skippy up` stops. The figures (requests sent,
completed, errored, hung; restart times; memory) are printed and written to
`<run_dir>/chaos-figures.json`, and to `$SKIPPY_CHAOS_REPORT` when set.

The load runs `SKIPPY_CHAOS_SECONDS` (20 s by default, for CI; the issue's full run is 60 s:
`SKIPPY_CHAOS_SECONDS=60 pytest tests/chaos/test_chaos.py -s`). Two settings:
- loopback: stages on ipc:// in one namespace, 20 ms per hop from the stages' own wire emulation
  (`--downstream-wire-delay-ms 20`, forward hops only);
- netns hosts: each stage in its own network namespace, 20 ms per direction on every link (netem, or
  skippy's link emulator where the kernel has no netem), 1% loss where netem exists, and the stage
  links authenticated (`skippy keys --topology`). Skips, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chaos_load import ChaosFigures, run_chaos
from up_helpers import SkippyServer, launch_up

from skippy.cli.keys import keys_for_topology
from skippy.launcher import write_local_topology
from skippy.netns import LinkConditions, netem_available
from skippy.netns.topology import place_on_hosts

DURATION_S = float(os.environ.get("SKIPPY_CHAOS_SECONDS", "20"))
STAGES = ["stage0", "stage1", "stage2"]
KILLS = ["stage1", "stage2", "stage0", "broker"]  # a middle stage, the final stage, stage 0, the broker
FLAT_MIB = 64.0  # survivors may grow by at most this (or a quarter), warm-up to end


def _report(figures: ChaosFigures, server: SkippyServer, setting: str) -> None:
    report = {"setting": setting, **figures.to_dict()}
    text = json.dumps(report, indent=2)
    print(f"chaos figures ({setting}):\n{text}")
    (server.run_dir / "chaos-figures.json").write_text(text + "\n")
    if os.environ.get("SKIPPY_CHAOS_REPORT"):
        with open(os.environ["SKIPPY_CHAOS_REPORT"], "a") as out:
            out.write(json.dumps(report) + "\n")


def _check(figures: ChaosFigures) -> None:
    assert (figures.hung, figures.errored) == (0, 0), figures
    assert figures.sent == figures.completed > 0, figures
    assert figures.distinct_texts == 1, figures  # every completed greedy stream equals the undisturbed one
    assert [(r.stage, r.probe) for r in figures.restarts] == [(s, "completed") for s in KILLS], figures
    assert figures.replays > 0 and figures.replayed_tokens > 0 and figures.resumed > 0, figures
    for name, (before, after) in figures.rss_mib.items():
        assert after - before <= max(FLAT_MIB, before / 4), (name, before, after)


def _chaos(server: SkippyServer, setting: str) -> list[int]:
    figures = run_chaos(server, kills=KILLS, stages=STAGES, duration_s=DURATION_S)
    _report(figures, server, setting)
    _check(figures)
    assert server.proc.poll() is None  # skippy up kept running throughout
    return [r.killed_pid for r in figures.restarts]


def test_chaos_on_loopback(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    with start_up("chaos-loopback", tiny_llama, "--split", "2,4", "--lane-count", "8", "--ctx-size", "512",
                  "--downstream-wire-delay-ms", "20", "--deterministic") as server:
        killed = _chaos(server, "loopback, 20 ms emulated per forward hop")
    assert all(not Path(f"/proc/{pid}").exists() for pid in killed)  # and launch_up checked no process is left


def test_chaos_on_netns_hosts(netns_hosts: Callable[..., Any], tiny_model: Callable[..., Path],
                              tmp_path_factory: pytest.TempPathFactory, skippy_cache_dir: Path) -> None:
    loss = 1.0 if netem_available() else 0.0
    hosts = netns_hosts(3, LinkConditions(delay_ms=20.0, loss_pct=loss))
    root = tmp_path_factory.mktemp("chaos-netns")
    # in <run_dir>/topology, where `skippy up` would write its own (SkippyServer.stage_pids looks there)
    topology, configs = write_local_topology(root / "run" / "topology", tiny_model("llama"), 6, [2, 4], lane_count=8,
                                             ctx_size=512, model_id="tiny", extra={"deterministic": True})
    place_on_hosts(topology, configs, [address for _, address in hosts.hosts])
    keys_for_topology(topology, topology.parent / "keys", ["client"])
    with launch_up(root, skippy_cache_dir, None, ["--topology", str(topology)]) as server:
        killed = _chaos(server, f"netns hosts, 20 ms per direction, {loss:g}% loss, CURVE links")
        assert all('"links_secured"' in (server.run_dir / f"{s}.log").read_text() for s in STAGES)
    assert all(not Path(f"/proc/{pid}").exists() for pid in killed)
