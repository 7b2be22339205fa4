"""`skippy up` brings a dead child back: bounded exponential backoff, a give-up limit, counts in /metrics.

When a child exits while `skippy up` runs (a stage, the broker or the adapter), `ChildRestarter`
starts it again the way it was first started after `backoff(streak)` seconds (0.5, 1, 2, 4, 8, 8, ...
s); `streak` counts deaths in a row and starts afresh once the child has stayed up `stable_after_s`.
After `max_restarts` deaths in a row it gives up and `skippy up` stops everything. A stage after stage
0 that comes back is noticed by stage 0's heartbeats, greeted again and serves once the Ready comes
back (skippy.driver.inbound); the other processes keep running. A restarted stage 0 greets the chain
afresh (each stage drops the sessions of its old upstream); the broker ends what the dead one held with
`pipeline_lost` once it stops answering, the adapter resumes those requests from the tokens their
clients already have (skippy.adapter.resume), and the broker routes them and new requests to it once it
is ready. A restarted broker binds the same endpoint (the adapter's DEALER reconnects; what the dead
one held ends with `pipeline_lost` at the adapter's client, skippy.client, and is resumed the same
way); a restarted adapter binds the same HTTP port it first got (clients reconnect). Restarts run on one
long-lived thread: a child gets SIGTERM when the thread that started it exits (PR_SET_PDEATHSIG), so that
thread lives as long as the children it starts may. Stage 0's own OpenAI front (skippy.cli.front) restarts
its broker and adapter the same way.

A starter may bring a child back another way and say so (`RestartSuperseded`: nothing recorded), `given_up` may
deal with a child that died too often (skippy.remote.host_loss drops its host), `run_soon` runs a job on the
restarts' thread, and `StageRestarter.restage` follows a re-plan's new stages.

Every restart is recorded in `<run_dir>/restarts.json` (total restarts, the last one's duration from
death to ready, exit codes); the adapter reads it at each scrape (skippy.telemetry.restart_counts) and serves
`skippy_stage_restarts_total{stage}` and `skippy_stage_last_restart_seconds{stage}` (the broker and the
adapter listed as stages "broker" and "adapter"). Each death is reported (`child_died`) and each
restart (`child_restarted`): by `skippy up` on its stderr, by stage 0 in its log.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skippy.launcher import READY_TIMEOUT_S, Children, LaunchError, StageProcesses

RESTARTS_FILE = "restarts.json"

Starter = Callable[[float], None]  # start a child again, waiting up to the given seconds for its ready line
Job = tuple[str, float, float] | Callable[[], None]  # (child, backoff, died at): a restart; a callable: run it


class RestartSuperseded(Exception):  # noqa: N818  (not an error: the starter did something else instead)
    """Raised by a starter that brought the child back another way (a re-plan started every stage anew): the
    restart is not recorded as one."""
Report = Callable[[str, str, dict[str, Any]], None]  # (event, line, fields): child_died / child_restarted


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5  # deaths in a row of one stage that are restarted; 0: never restart
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    stable_after_s: float = 60.0  # a stage up this long starts its streak afresh
    ready_timeout_s: float = READY_TIMEOUT_S

    def backoff(self, streak: int) -> float:
        """Seconds before restart number `streak` (1-based) of a streak."""
        return min(self.max_backoff_s, self.initial_backoff_s * 2 ** max(0, streak - 1))


@dataclass
class StageRestarts:
    """One stage's record (the JSON in restarts.json, plus the bookkeeping of its streak)."""

    restarts: int = 0
    last_restart_seconds: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    streak: int = 0
    started_at: float = field(default_factory=time.monotonic)


class ChildRestarter:
    """Restarts the children named in `starters` when they die; `restart` is `supervise`'s hook."""

    def __init__(self, children: Children, starters: dict[str, Starter], policy: RestartPolicy,
                 state_path: Path | None, report: Report | None = None) -> None:
        self.children = children
        self.starters = starters
        self.policy = policy
        self.state_path = state_path
        self.report = report or say
        self.records = {name: StageRestarts() for name in starters}
        self.state_extra: dict[str, Any] = {}  # written into restarts.json beside the records (skippy.remote.host_loss)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="child-restarter", daemon=True)
        self._thread.start()
        self._write_state()

    def restart(self, name: str, code: int) -> bool:
        """Child `name` exited with `code`: True when it will be restarted (after its backoff)."""
        record = self.records.get(name)
        if record is None or self._closed.is_set():
            return False
        now = time.monotonic()
        with self._lock:
            if now - record.started_at >= self.policy.stable_after_s:
                record.streak = 0
            record.streak += 1
            record.exit_codes.append(code)
            streak = record.streak
        log = self.children.log_path(name)
        fields: dict[str, Any] = {"child": name, "exit_code": code, "log": str(log), "streak": streak}
        if streak > self.policy.max_restarts:
            why = "restarts are off (--max-stage-restarts 0)" if self.policy.max_restarts == 0 else (
                f"it died {streak} times in a row (--max-stage-restarts {self.policy.max_restarts})")
            self.report("child_died", f"{name} exited with code {code} (log {log}); not restarting: {why}",
                        {**fields, "restart_in_s": None, "error": why})
            return self.given_up(name, why)
        delay = self.policy.backoff(streak)
        self.report("child_died", f"{name} exited with code {code} (log {log}); restarting it in {delay:g} s "
                    f"({streak} of at most {self.policy.max_restarts} in a row)", {**fields, "restart_in_s": delay})
        self._jobs.put((name, delay, now))
        return True

    def given_up(self, name: str, why: str) -> bool:
        """`name` died too often in a row (`why`): True when it is dealt with otherwise; False: everything stops."""
        return False

    def run_soon(self, job: Callable[[], None]) -> None:
        """Run `job` on the restarts' thread (the children it starts live as long as that thread)."""
        self._jobs.put(job)

    def close(self) -> None:
        """No more restarts (call before the children are stopped); a launch under way is abandoned."""
        self._closed.set()
        self._jobs.put(None)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if callable(job):
                job()
                continue
            name, delay, died_at = job
            if self._closed.wait(delay):
                return
            starter, proc = self.starters.get(name), self.children.procs.get(name)
            if starter is None or (proc is not None and proc.poll() is None):
                continue  # no longer served, or already back (a re-plan started it anew)
            try:
                starter(self.policy.ready_timeout_s)
            except RestartSuperseded:
                continue
            except LaunchError as exc:  # its exit (killed here if it hangs) comes back through `restart`
                proc = self.children.procs.get(name)
                if proc is not None and proc.poll() is None:
                    proc.kill()
                if not self._closed.is_set():
                    self.report("child_restart_failed", f"restarting {name} failed: {exc}",
                                {"child": name, "error": str(exc)})
                continue
            self._started(name, time.monotonic() - died_at)

    def _started(self, name: str, took_s: float) -> None:
        with self._lock:
            record = self.records[name]
            record.restarts += 1
            record.last_restart_seconds = round(took_s, 3)
            record.started_at = time.monotonic()
        self._write_state()
        self.report("child_restarted", f"{name} restarted (restart {record.restarts}, {took_s:.2f} s after it died)",
                    {"child": name, "restart": record.restarts, "took_s": round(took_s, 3)})

    def _write_state(self) -> None:
        if self.state_path is None:
            return
        with self._lock:
            state = {stage: {k: v for k, v in asdict(r).items() if k not in ("streak", "started_at")}
                     for stage, r in self.records.items()}
            state.update(self.state_extra)
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_path)


class StageRestarter(ChildRestarter):
    """Restarts the stages of `stages` (stage 0 too with `include_stage0`) and the children in `extra`."""

    def __init__(self, stages: StageProcesses, policy: RestartPolicy, state_path: Path | None, *,
                 include_stage0: bool = False, extra: dict[str, Starter] | None = None,
                 report: Report | None = None) -> None:
        self.stages = stages
        self.first = 0 if include_stage0 else 1
        self.stage_names: set[str] = set()
        super().__init__(stages, {**self._stage_starters(), **(extra or {})}, policy, state_path, report)

    def stage_starter(self, index: int, stage_id: str) -> Starter:
        """How stage `index` (of `stages.stage_ids()`) is started again."""
        return lambda timeout_s: self.stages.start_stage(index, timeout_s)

    def _stage_starters(self) -> dict[str, Starter]:
        starters = {stage_id: self.stage_starter(n, stage_id)
                    for n, stage_id, index in self.stages.stage_ids() if index >= self.first}
        self.stage_names = set(starters)
        return starters

    def restage(self) -> None:
        """The stages changed (a re-plan): restart each by its new index, with a record for each new stage id; the
        stage ids no longer served are not restarted (their records stay)."""
        with self._lock:
            for name in self.stage_names:
                self.starters.pop(name, None)
            starters = self._stage_starters()
            self.starters.update(starters)
            for name in starters:
                self.records.setdefault(name, StageRestarts())
        self._write_state()


def say(event: str, line: str, fields: dict[str, Any]) -> None:
    """`skippy up`'s report: one line on its stderr, tagged with the event."""
    _say(f"{line} [{event}]")


def _say(line: str) -> None:
    print(f"skippy up: {line}", file=sys.stderr, flush=True)
