"""Losing a host: an SSH host that cannot run its stages any more is dropped, and the model re-planned over the rest.

`HostLossRestarter` is `skippy up`'s restarter when stages run on SSH hosts. A stage that dies is restarted on its
host as any other (skippy.restarts); the restart asks the host first (skippy.remote.ssh_stages). A host is *lost*
when that fails (SSH cannot reach it, or it fails its checks: `HostUnusable`) or when its stage does not come back
(it died `--max-stage-restarts` times in a row, each start bounded by the ready timeout). Then, on the restarts'
thread (the children it starts live as long as that thread):

1. The planner is asked for the hosts left, in the hosts file's order (`replan`: `skippy up`'s own planning, a
   split, written over the run's topology directory). If they cannot hold the model, the reason (naming the lost
   host) goes into restarts.json as `hosts.failed` first, then the broker is killed: the adapter ends every waiting
   request with that reason (skippy.adapter.resume) and `skippy up` stops.
2. Otherwise the broker is killed (SIGKILL: a broker that stops cleanly fails its requests; lost, the adapter
   resumes them) and every stage is stopped; their exits are not restarts.
3. The new plan's SSH stages are checked and sent their slices (their new layer ranges), started downstream first,
   then the broker, which reads the new topology. The adapter submits each request it holds again from the tokens
   its client has (`resume_from`); the new stage 0 replays it, so it ends with the undisturbed text. A host that
   fails now is dropped too, and the planner asked again.

A replicated plan (one pipeline per host) is not re-planned: the lost host's replica is not restarted and the others
serve on (the broker routes around it; the adapter resumes what it lost), until none is left.

restarts.json's `hosts` (skippy.telemetry.restart_counts) records each host's state (`serving`, `spare`, `dropped`
with the reason), its stages and the number of re-plans, which the adapter's /metrics serves.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from skippy.config.errors import ConfigError
from skippy.launcher import LaunchError, PipelineFiles, StageProcesses
from skippy.plan.hosts import Host
from skippy.remote.ssh_stages import HostUnusable, SshStages, planned_stages
from skippy.restarts import Report, RestartPolicy, RestartSuperseded, StageRestarter, Starter
from skippy.telemetry.restart_counts import HOSTS_STATE

__all__ = ["HostLossRestarter", "Replan"]

Replan = Callable[[list[Host]], Sequence[PipelineFiles]]  # the plan for these hosts, written over the topology
STOP_TIMEOUT_S = 30.0  # a stage stopped for a re-plan gets this long (a remote one: its host's own grace), then SIGKILL


class HostLossRestarter(StageRestarter):
    """Restarts `stages` (stage 0 included) and the front's children (`front`: the broker and the adapter); drops a
    lost SSH host and serves on over the hosts left."""

    def __init__(self, stages: StageProcesses, policy: RestartPolicy, state_path: Path | None,
                 front: dict[str, Starter], remote: SshStages, replan: Replan, *, insecure_links: bool,
                 report: Report | None = None) -> None:
        self.remote, self.replan, self.insecure_links = remote, replan, insecure_links
        self.dropped: dict[str, str] = {}  # host name -> why it was dropped
        self.replans = 0
        self.failed: str | None = None  # why nothing is served any more
        self._retired: set[subprocess.Popen[bytes]] = set()  # stopped here: their exits are not deaths
        super().__init__(stages, policy, state_path, include_stage0=True, extra=front, report=report)
        self._record_hosts()

    def stage_starter(self, index: int, stage_id: str) -> Starter:
        start = super().stage_starter(index, stage_id)

        def start_or_lose_host(timeout_s: float) -> None:
            try:
                start(timeout_s)
            except HostUnusable as error:
                self.lose(error.host, str(error))
                raise RestartSuperseded from None

        return start_or_lose_host

    def restart(self, name: str, code: int) -> bool:
        if self.failed is not None:
            return False
        proc = self.children.procs.get(name)
        if proc is not None and (proc in self._retired or proc.poll() is None):
            return True  # stopped by a re-plan, or an older process of a name started anew since
        return super().restart(name, code)

    def given_up(self, name: str, why: str) -> bool:
        stage = self.remote.stages.get(name)
        if stage is None or self.closed:
            return False
        self.run_soon(lambda: self.lose(stage.host.name, f"host {stage.host.name}: {name} did not come back, {why}"))
        return True

    def lose(self, host: str, why: str) -> None:
        """Drop `host` and serve on over the hosts left, or stop when they cannot hold the model."""
        if host in self.dropped or self.closed:
            return
        if len(self.stages.pipelines) > 1:
            self._lose_replica(host, why)
            return
        while not self.closed:
            self.dropped[host] = why
            self.report("host_lost", f"{why}: host {host} is lost, dropping it and planning over the hosts left",
                        {"host": host, "error": why})
            left = [h for h in self.remote.all_hosts if h.name not in self.dropped]
            try:
                if not left:
                    raise ConfigError("no host is left")
                pipelines = self.replan(left)
            except HostUnusable as error:  # asked for its cost table, a host left failed too
                host, why = error.host, str(error)
                continue
            except ConfigError as error:
                self._fail(host, why, left, error)
                return
            self._stop_serving()
            try:
                self._start(pipelines)
            except HostUnusable as error:
                host, why = error.host, str(error)
                continue
            except LaunchError as error:  # a stage on a host of this machine: nothing to drop
                self._fail(host, why, left, error)
                return
            self.replans += 1
            self.restage()
            self._record_hosts()
            layout = ", ".join(f"{s.stage_id} on {s.host.name} (layers {s.layer_start}-{s.layer_end})"
                               for s in self.remote.stages.values())
            self.report("replanned", f"re-planned over {', '.join(h.name for h in left)}: {layout}; the requests in"
                        " flight resume", {"hosts": [h.name for h in left], "replans": self.replans})
            return

    def _lose_replica(self, host: str, why: str) -> None:
        """A replicated plan: the lost host's replica is not served any more; the others serve on."""
        self.dropped[host] = why
        serving = {s.host.name for s in self.remote.stages.values()} - set(self.dropped)
        if not serving:
            self._fail(host, why, [], ConfigError("no replica is left"))
            return
        self._record_hosts()
        self.report("host_lost", f"{why}: host {host} is lost; its replica is not restarted, the replicas on"
                    f" {', '.join(sorted(serving))} serve on", {"host": host, "error": why})

    def _fail(self, host: str, why: str, left: list[Host], error: Exception) -> None:
        names = ", ".join(h.name for h in left) or "none"
        self.failed = f"host {host} was lost, and the hosts left ({names}) cannot serve the model: {error} ({why})"
        self._record_hosts()  # before the broker goes: the adapter gives each waiting request this reason
        self.report("replan_failed", f"{self.failed}; stopping", {"host": host, "error": self.failed})
        # one exit stops `skippy up` (restart says no from now on): the broker's (its requests end at the adapter,
        # with that reason), else a stage's, else the adapter's (it fails what it holds with that reason)
        for name, how in [("broker", signal.SIGKILL), *((s, signal.SIGTERM) for s in self._stage_ids()),
                          ("adapter", signal.SIGTERM)]:
            proc = self.children.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(how)
                return

    def _stage_ids(self) -> list[str]:
        """The stages now served and those started for a re-plan under way."""
        return sorted(self.stage_names | {stage_id for _, stage_id, _ in self.stages.stage_ids()})

    def _stop_serving(self) -> None:
        """The broker killed (lost, its requests resume), then every stage stopped; none of it restarted."""
        self._stop(["broker"], signal.SIGKILL)
        self._stop(self._stage_ids(), signal.SIGTERM)

    def _stop(self, names: list[str], how: signal.Signals) -> None:
        procs = [p for p in (self.children.procs.get(name) for name in names) if p is not None]
        self._retired.update(procs)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(how)
        for proc in procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _start(self, pipelines: Sequence[PipelineFiles]) -> None:
        """The new plan's stages, downstream first (each SSH host checked and sent its slices first), then the
        broker. HostUnusable names a host that failed."""
        self.stages.use(pipelines)
        assert self.remote.plan_summary is not None
        self.remote.use(planned_stages(self.remote.all_hosts, self.remote.plan_summary, pipelines,
                                       insecure_links=self.insecure_links))
        self.remote.prepare()
        for n, stage_id, _ in reversed(self.stages.stage_ids()):
            try:
                self.stages.start_stage(n, self.policy.ready_timeout_s)
            except HostUnusable:
                raise
            except LaunchError as error:
                stage = self.remote.stages.get(stage_id)
                if stage is None:
                    raise
                raise HostUnusable(stage.host.name, str(error)) from None
        self.starters["broker"](self.policy.ready_timeout_s)

    def _record_hosts(self) -> None:
        """Each host's state and stages, the re-plans and the failure, into restarts.json."""
        try:
            planned = json.loads(self.remote.plan_summary.read_text())["stages"] if self.remote.plan_summary else []
        except (OSError, ValueError, KeyError):
            planned = []
        hosts: list[dict[str, Any]] = []
        for host in self.remote.all_hosts:
            stages = [s["stage_id"] for s in planned if s.get("host") == host.name and host.name not in self.dropped]
            state = "dropped" if host.name in self.dropped else "serving" if stages else "spare"
            hosts.append({"name": host.name, "address": host.address, "state": state, "stages": stages,
                          **({"reason": self.dropped[host.name]} if host.name in self.dropped else {})})
        self.state_extra[HOSTS_STATE] = {"replans": self.replans, "failed": self.failed, "hosts": hosts}
        self._write_state()
