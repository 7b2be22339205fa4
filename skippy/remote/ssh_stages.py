"""The stages `skippy up --hosts FILE` runs on hosts it reaches over SSH: checked, supplied, then started there.

`ssh_stages` reads which stage the plan put on which host (the plan's plan.json) and, unless
`--insecure-links`, gives every stage and the client a CURVE key pair (in `<run_dir>/topology/keys`), since
these links leave the machine. `SshStages.prepare`, before any stage starts, asks every SSH host at once
(skippy.remote.probe) for its Python, its skippy (version and source digest: they must be this checkout's)
and its available memory (at least what the plan gives its stages), and sends each stage's slice that its
host's cache lacks (skippy.remote.shipping; none when the hosts file names `ssh.model_path`, the model
already there). Each failure is one line naming the host. Then `prefix(stage_id)` is the command the
launcher starts the stage through: the relay (skippy.remote.relay), with a spec in `<run_dir>/remote/`.
A stage that dies is restarted through it like any other (skippy.restarts); its host is asked again first: a
host that cannot be reached or supplied any more raises `HostUnusable`, and skippy.remote.host_loss drops it and
re-plans over the hosts left (`use` then takes the new plan's stages).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skippy.config.link_keys import CLIENT_NAME
from skippy.launcher import PipelineFiles
from skippy.plan.hosts import Host, load_hosts
from skippy.remote import probe
from skippy.remote.shipping import SliceFile, send_slice, stage_slice
from skippy.remote.ssh import RemoteError, remote_command, run_remote, ssh_argv
from skippy.runtime.slices import file_digest, read_model_info
from skippy.transport.curve_keys import add_link_keys

__all__ = ["HostUnusable", "RemoteStage", "SshStages", "check_host", "host_label", "planned_stages", "ssh_stages"]

MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class RemoteStage:
    stage_id: str
    host: Host
    layer_start: int
    layer_end: int
    memory_mib: float  # what the plan gives it


class HostUnusable(RemoteError):
    """Host `host` cannot run its stages (unreachable over SSH, or refused by its checks); the message says why."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(message)
        self.host = host


def _say(line: str) -> None:
    print(f"skippy up: {line}", file=sys.stderr, flush=True)


class SshStages:
    """The stages on SSH hosts of one `skippy up`: `prepare()` once before anything starts, then `prefix`."""

    def __init__(self, model: Path, stages: Sequence[RemoteStage], run_dir: Path, hosts: Sequence[Host] = (),
                 plan_summary: Path | None = None, say: Callable[[str], None] = _say) -> None:
        self.model, self.run_dir, self.say = model, run_dir, say
        self.plan_summary = plan_summary  # the plan's plan.json (rewritten by a re-plan)
        self.all_hosts = list(hosts)  # every host of the hosts file, in its order (a re-plan chooses among them)
        self.stages = {s.stage_id: s for s in stages}
        self.n_layer = read_model_info(model).n_layer
        self.specs = run_dir / "remote"
        self.token = f"{run_dir.name}-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]}"
        self._fresh: set[str] = set()  # prepared and not yet started: a later start asks its host again

    def use(self, stages: Sequence[RemoteStage]) -> None:
        """A re-plan's SSH stages replace these (`prepare` them before they start)."""
        self.stages = {s.stage_id: s for s in stages}
        self._fresh = set()

    def hosts(self) -> dict[str, list[RemoteStage]]:
        by_host: dict[str, list[RemoteStage]] = {}
        for stage in self.stages.values():
            by_host.setdefault(stage.host.name, []).append(stage)
        return by_host

    def prepare(self) -> None:
        """Check every SSH host and send what it lacks, all hosts at once; RemoteError (one line) on the first
        that cannot run its stages."""
        model_digest = file_digest(self.model)  # once, before the hosts' threads want it
        groups = list(self.hosts().values())
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            for _ in pool.map(lambda group: self._prepare_host(group, model_digest), groups):
                pass
        self._fresh = set(self.stages)

    def prefix(self, stage_id: str) -> list[str]:
        stage = self.stages.get(stage_id)
        if stage is None:
            return []
        if stage_id not in self._fresh:  # a restart: the host may have lost its cache since (HostUnusable: gone)
            self._prepare_host([stage], file_digest(self.model))
        self._fresh.discard(stage_id)
        return [sys.executable, "-m", "skippy.remote.relay", str(self.specs / f"{stage_id}.json"), "--"]

    def _prepare_host(self, stages: list[RemoteStage], model_digest: str) -> None:
        try:
            self._supply_host(stages, model_digest)
        except RemoteError as error:
            raise HostUnusable(stages[0].host.name, str(error)) from None

    def _supply_host(self, stages: list[RemoteStage], model_digest: str) -> None:
        host = stages[0].host
        target = host.ssh
        assert target is not None
        label = host_label(host)
        pieces = {} if target.model_path else {
            s.stage_id: stage_slice(self.model, s.layer_start, s.layer_end, self.n_layer) for s in stages}
        found = check_host(host, label, [p.cache_name for p in pieces.values()])
        need = sum(s.memory_mib for s in stages)
        available = found.get("mem_available")
        if isinstance(available, int) and available < need * (1 << 20):
            raise RemoteError(f"{label}: the plan gives it {need:.0f} MiB ({', '.join(s.stage_id for s in stages)}), it has"
                              f" {available / (1 << 20):.0f} MiB available; lower its mem_mb in the hosts file")
        cache = str(found["cache_dir"])
        for stage in stages:
            piece = pieces.get(stage.stage_id)
            if piece is not None:
                self._supply(host, label, stage, piece, cache, found["have"])
            self._write_spec(stage, cache, model_digest, piece)

    def _supply(self, host: Host, label: str, stage: RemoteStage, piece: SliceFile, cache: str,
                have: dict[str, int]) -> None:
        what = f"{stage.stage_id}'s slice (layers {stage.layer_start}-{stage.layer_end})"
        if have.get(piece.cache_name) == piece.size:
            self.say(f"{host.name} has {what} in its cache: nothing sent")
            return
        seconds = send_slice(host.ssh, label, piece, cache)  # type: ignore[arg-type]  # an SSH host
        self.say(f"sent {what} to {host.name}: {piece.data_bytes / 1e6:.1f} MB of the"
                 f" {self.model.stat().st_size / 1e6:.1f} MB model in {seconds:.1f} s")
        have[piece.cache_name] = piece.size

    def _write_spec(self, stage: RemoteStage, cache: str, model_digest: str, piece: SliceFile | None) -> None:
        target = stage.host.ssh
        assert target is not None
        directory = f"{cache}/runs/{self.token}/{stage.stage_id}"
        config: dict[str, object] = {"source_model_sha256": model_digest, "load_mode": "runtime-slice",
                                     "model_path": target.model_path}
        if piece is not None:
            config.update(load_mode="artifact-slice", model_path=f"{cache}/{piece.cache_name}")
        command = remote_command(target, ["-m", "skippy.remote.host_agent", "launch", directory])
        spec = {"host": stage.host.name, "ssh": ssh_argv(target, command), "cache_dir": cache, "config": config}
        self.specs.mkdir(parents=True, exist_ok=True)
        (self.specs / f"{stage.stage_id}.json").write_text(json.dumps(spec, indent=2))


def host_label(host: Host) -> str:
    """How a line names an SSH host: `host h1 (ssh me@10.0.0.11 -p 22)`."""
    return f"host {host.name} ({host.ssh.describe() if host.ssh else host.address})"


def check_host(host: Host, label: str, files: list[str]) -> dict[str, Any]:
    """What the probe finds on `host` (skippy.remote.probe), once its Python and skippy are this one's; RemoteError
    (one line, starting with `label`) otherwise."""
    target = host.ssh
    assert target is not None
    text = run_remote(target, label, ["-c", Path(probe.__file__).read_text(), target.cache_dir, *files])
    try:
        found = dict(json.loads(text.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise RemoteError(f"{label}: its probe answered {text.strip()[:200]!r}, not JSON") from None
    python = tuple(int(x) for x in str(found["python"]).split(".")[:2])
    if python < MIN_PYTHON:
        raise RemoteError(f"{label}: {target.python} there is Python {found['python']}; skippy needs"
                          f" {'.'.join(map(str, MIN_PYTHON))}+ (set ssh.python in the hosts file)")
    version, digest = probe.skippy_identity()
    if found["skippy"] is None:
        raise RemoteError(f"{label}: {target.python} there has no skippy; install skippy {version} there (the"
                          " same as here), or set ssh.python to the Python that has it")
    if (found["skippy"], found["source_digest"]) != (version, digest):
        raise RemoteError(f"{label}: it has skippy {found['skippy']} (source {str(found['source_digest'])[:12]}),"
                          f" this machine {version} (source {str(digest)[:12]}); install the same skippy on both")
    return found


def ssh_stages(hosts_file: Path | None, plan_summary: Path, pipelines: Sequence[PipelineFiles], run_dir: Path,
               *, insecure_links: bool) -> SshStages | None:
    """The SSH stages of a plan written for `hosts_file` (None: no host there names `ssh`). Without
    `insecure_links` every pipeline gets link keys first (one directory: one client pair for all)."""
    if hosts_file is None:
        return None
    hosts = load_hosts(hosts_file)
    if not any(h.ssh for h in hosts):
        return None
    stages = planned_stages(hosts, plan_summary, pipelines, insecure_links=insecure_links)
    model = Path(json.loads(plan_summary.read_text())["model"])
    return SshStages(model, stages, run_dir, hosts, plan_summary) if stages else None


def planned_stages(hosts: Sequence[Host], plan_summary: Path, pipelines: Sequence[PipelineFiles], *,
                   insecure_links: bool) -> list[RemoteStage]:
    """The stages of the plan in `plan_summary` that run on SSH hosts (link keys first, unless `insecure_links`)."""
    by_name = {h.name: h for h in hosts}
    if not insecure_links:
        for pipeline in pipelines:
            add_link_keys(pipeline.topology, plan_summary.parent / "keys", [CLIENT_NAME])
    summary = json.loads(plan_summary.read_text())
    return [RemoteStage(entry["stage_id"], by_name[entry["host"]], entry["layer_start"], entry["layer_end"],
                        entry["memory_mib"]) for entry in summary["stages"] if by_name[entry["host"]].ssh]
