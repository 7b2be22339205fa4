"""The OpenAI front of a pipeline: the broker and the adapter, started as supervised child processes.

Two surfaces start it. `skippy up` starts it next to the stages it launches; a stage 0 started on its own,
`skippy stage ... --openai-bind-addr`, starts it as its own children
(logs in a run directory named in stage 0's `openai_ready` line). Either way a broker or adapter that dies is
restarted with backoff (skippy.restarts; the give-up limit applies): the broker on the same endpoint,
the adapter on the HTTP port it first bound, so clients reconnect to the same URL (connections are
refused while it is down); stage 0 logs `child_died` and `child_restarted`, and stops (exit 1) when
one has died too often in a row. Either way it is configured from the resolved `--openai-*` options: admission goes
to the broker (written back as flags by `AdmissionOptions.to_flags`, which the broker reads with the
same resolver), the model id, default max tokens, CORS origins and HTTP limits to the adapter; prefill and speculative options
stay with stage 0's driver; the telemetry flags go to both, and the adapter's /dashboard reads the
run directory's metrics-targets.json (stage 0 lists itself there on its own surface). This is the
one launch recipe of the front.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from skippy.config import ConfigError, ServingOptions
from skippy.http.auth import API_KEY_ENV
from skippy.launcher import READY_TIMEOUT_S, Children
from skippy.log import get_logger
from skippy.restarts import RESTARTS_FILE, ChildRestarter, RestartPolicy, Starter
from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import current
from skippy.telemetry.targets import TARGETS_FILE, record_target


def cors_flags(origins: tuple[str, ...]) -> list[str]:
    """The adapter's `--cors-origins` for the resolved `--openai-cors-origins` (none: CORS off)."""
    return ["--cors-origins", ",".join(origins)] if origins else []


def strict_fields_flags(strict: bool) -> list[str]:
    """The adapter's `--strict-request-fields` for `--openai-strict-request-fields` (off: unknown fields ignored)."""
    return ["--strict-request-fields"] if strict else []


class FrontProcesses:
    """The broker and the adapter of one front, each startable again the way it first started
    (`starters`, for a ChildRestarter): the broker on the same endpoint, the adapter on the port it
    first bound (`--bind HOST:0` picks one the first time only), so clients reconnect to the same URL."""

    def __init__(self, children: Children, options: ServingOptions, topology: Path,
                 replicas: Sequence[Path] = ()) -> None:
        openai = options.openai
        assert openai is not None
        self.children, self.options, self.topology = children, options, topology
        self.pipelines = [topology, *replicas]  # the broker routes over each (the adapter shows the first's stages)
        self.level = TelemetryOptions.from_serving(options).to_flags()  # every child at the stages' telemetry settings
        self.broker = f"ipc://{children.run_dir}/broker.sock"
        self.events = f"ipc://{children.run_dir}/events.sock"  # token events straight from stage 0 (direct_events)
        self.bind = openai.bind_addr
        self.url = ""
        if openai.api_key is not None:  # to broker and adapter by their environment: a command line is visible to anyone
            children.env[API_KEY_ENV] = openai.api_key

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Start the broker, then the adapter; returns the adapter's URL."""
        self.start_broker(timeout_s)
        self.start_adapter(timeout_s)
        return self.url

    def start_broker(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        openai = self.options.openai
        assert openai is not None
        pipelines = [arg for topology in self.pipelines for arg in ("--pipeline", str(topology))]
        self.children.start_process("broker", ["broker", "--bind", self.broker, *pipelines,
                                               *openai.admission.to_flags(), *self.level,
                                               "--metrics-bind", self.options.metrics_bind], timeout_s)

    def start_adapter(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        openai, cfg, run_dir = self.options.openai, self.options.config, self.children.run_dir
        assert openai is not None
        ready = self.children.start_process("adapter", [
            "adapter", "--broker", self.broker, "--events-endpoint", self.events, "--model", str(cfg.model_path or "default"),
            "--model-id", openai.model_id, "--bind", self.bind, "--default-max-tokens", str(openai.default_max_tokens),
            "--openai-resume-timeout-s", f"{self.options.resume_timeout_s:g}",
            "--sse-ping-interval", f"{openai.sse_ping_interval_s:g}", "--topology", str(self.topology),
            *self.level, *cors_flags(openai.cors_origins), *openai.http.adapter_flags(),
            *strict_fields_flags(openai.strict_request_fields),
            "--metrics-targets", str(run_dir / TARGETS_FILE), "--restarts-file", str(run_dir / RESTARTS_FILE)], timeout_s)
        self.url = str(ready["url"])
        self.bind = f"{self.bind.rpartition(':')[0]}:{urlsplit(self.url).port}"  # a restart binds the same port

    def starters(self) -> dict[str, Starter]:
        return {"broker": self.start_broker, "adapter": self.start_adapter}


def start_front(children: Children, options: ServingOptions, topology: Path) -> FrontProcesses:
    """Start broker + adapter as `children` for the pipeline in `topology` (the adapter's URL: `.url`)."""
    front = FrontProcesses(children, options, topology)
    front.start()
    return front


class OpenAIFront:
    """Stage 0's front: its children, restarted with backoff when they die (stage 0 logs each death and restart)."""

    def __init__(self, children: Children, front: FrontProcesses, policy: RestartPolicy) -> None:
        self.children, self.front = children, front
        self.run_dir = children.run_dir
        log = get_logger()
        self.restarter = ChildRestarter(children, front.starters(), policy, children.run_dir / RESTARTS_FILE,
                                        lambda event, _line, fields: log.warning(event, **fields))

    async def wait_dead(self) -> tuple[str, int]:
        return await self.children.wait_dead()

    def log_path(self, name: str) -> Path:
        return self.children.log_path(name)

    def restart(self, name: str, code: int) -> bool:
        """True when `name` will be back (after its backoff); False: given up (or stopping)."""
        return self.restarter.restart(name, code)

    def stop(self) -> dict[str, int | None]:
        self.restarter.close()
        return self.children.stop()


def start_openai_front(options: ServingOptions) -> tuple[OpenAIFront, str]:
    """Stage 0's `--openai-bind-addr`: start the front in a fresh run directory; (front, URL)."""
    if options.topology is None:
        raise ConfigError("--openai-bind-addr needs --topology (the broker reaches stage 0 through it)")
    run_dir = Path(tempfile.mkdtemp(prefix=f"skippy-{options.config.stage_id}-openai-"))
    topology = run_dir / "topology.json"
    topology.write_text(options.topology.to_json())
    children = Children(run_dir)
    record_target(run_dir, options.config.stage_id, {"metrics_url": current().metrics_url})
    try:
        front = start_front(children, options, topology)
    except BaseException:
        children.stop()
        raise
    return OpenAIFront(children, front, RestartPolicy()), front.url
