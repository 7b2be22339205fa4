"""The restart policy of `skippy up` without processes: backoff bounds, streaks, give-up, a restart brought back
another way (a re-plan), the metrics file with its hosts' record."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from skippy.restarts import RestartPolicy, RestartSuperseded, StageRestarter
from skippy.telemetry.restart_counts import RestartsCollector, pipeline_gone, read_restarts


class FakeStages:
    """What StageRestarter uses of StageProcesses: the topology, log paths, start_stage, procs."""

    def __init__(self, run_dir: Path) -> None:
        self.topology = SimpleNamespace(stages=[SimpleNamespace(stage_id=f"stage{i}") for i in range(3)])
        self.run_dir = run_dir
        self.procs: dict[str, Any] = {}
        self.started: list[int] = []
        self.started_event = threading.Event()

    def log_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def stage_ids(self) -> list[tuple[int, str, int]]:
        return [(i, s.stage_id, i) for i, s in enumerate(self.topology.stages)]

    def start_stage(self, index: int, timeout_s: float) -> None:
        self.started.append(index)
        self.started_event.set()


def test_backoff_doubles_up_to_its_bound() -> None:
    policy = RestartPolicy(initial_backoff_s=0.5, max_backoff_s=8.0)
    assert [policy.backoff(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_restarts_stages_after_stage0_until_the_streak_limit(tmp_path: Path) -> None:
    stages = FakeStages(tmp_path)
    state = tmp_path / "restarts.json"
    restarter = StageRestarter(stages, RestartPolicy(max_restarts=2, initial_backoff_s=0.0), state)  # type: ignore[arg-type]
    try:
        assert read_restarts(state) == {"stage1": {"restarts": 0, "last_restart_seconds": None, "exit_codes": []},
                                        "stage2": {"restarts": 0, "last_restart_seconds": None, "exit_codes": []}}
        assert not restarter.restart("stage0", -9)  # stage 0 is not restarted: everything stops
        assert not restarter.restart("broker", 1)
        assert restarter.restart("stage2", -9)
        assert stages.started_event.wait(30.0)
        deadline = time.monotonic() + 30.0
        while read_restarts(state)["stage2"]["restarts"] != 1:  # the state file is written after the start
            assert time.monotonic() < deadline
            time.sleep(0.01)  # poll interval of a bounded poll
        assert stages.started == [2]
        assert read_restarts(state)["stage2"]["exit_codes"] == [-9]
        assert restarter.restart("stage2", -9)  # second in a row: still within max_restarts=2
        assert not restarter.restart("stage2", -9)  # third in a row: give up
    finally:
        restarter.close()
    assert not restarter.restart("stage1", -9)  # closed: no more restarts


def test_collector_serves_the_restarts_file(tmp_path: Path) -> None:
    path = tmp_path / "restarts.json"
    registry = CollectorRegistry()
    registry.register(RestartsCollector(path))
    assert b"skippy_stage_restarts_total{" not in generate_latest(registry)  # no file yet: no samples
    path.write_text('{"stage1": {"restarts": 2, "last_restart_seconds": 1.5, "exit_codes": [-9, -9]}}')
    text = generate_latest(registry).decode()
    assert 'skippy_stage_restarts_total{stage="stage1"} 2.0' in text
    assert 'skippy_stage_last_restart_seconds{stage="stage1"} 1.5' in text


def test_a_superseded_restart_is_not_recorded_and_a_given_up_child_may_be_kept(tmp_path: Path) -> None:
    stages = FakeStages(tmp_path)
    state = tmp_path / "restarts.json"
    kept: list[tuple[str, str]] = []
    ran = threading.Event()

    class Superseding(StageRestarter):
        def stage_starter(self, index: int, stage_id: str) -> Any:
            def start(timeout_s: float) -> None:
                self.run_soon(ran.set)  # after this job, on the same thread
                raise RestartSuperseded

            return start

        def given_up(self, name: str, why: str) -> bool:
            kept.append((name, why))
            return True

    restarter = Superseding(stages, RestartPolicy(max_restarts=1, initial_backoff_s=0.0), state)  # type: ignore[arg-type]
    try:
        assert restarter.restart("stage1", -9)
        assert ran.wait(30.0)
        assert read_restarts(state)["stage1"]["restarts"] == 0  # brought back another way: no restart recorded
        assert restarter.restart("stage1", -9)  # second in a row, past max_restarts=1: given up, but dealt with
        assert kept == [("stage1", "it died 2 times in a row (--max-stage-restarts 1)")]
    finally:
        restarter.close()


def test_collector_serves_replans_and_dropped_hosts(tmp_path: Path) -> None:
    path = tmp_path / "restarts.json"
    registry = CollectorRegistry()
    registry.register(RestartsCollector(path))
    path.write_text(json.dumps({"stage0": {"restarts": 0, "last_restart_seconds": None, "exit_codes": []},
                                "hosts": {"replans": 1, "failed": None, "hosts": [
                                    {"name": "h1", "state": "serving", "stages": ["stage0"]},
                                    {"name": "h2", "state": "dropped", "stages": [], "reason": "unreachable"}]}}))
    text = generate_latest(registry).decode()
    assert "skippy_replans_total 1.0" in text
    assert 'skippy_host_dropped{host="h1"} 0.0' in text and 'skippy_host_dropped{host="h2"} 1.0' in text
    assert set(read_restarts(path)) == {"stage0"} and pipeline_gone(path) is None
    path.write_text(json.dumps({"hosts": {"replans": 0, "failed": "host h2 was lost", "hosts": []}}))
    assert pipeline_gone(path) == "host h2 was lost"
