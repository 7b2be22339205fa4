"""The OpenAI front of a pipeline: the broker and the adapter, started as supervised child processes.

Two surfaces start it. `skippy up` starts it next to the stages it launches; the reference's
stage-0 surface, `skippy stage ... --openai-bind-addr`, makes stage 0 start it as its own children
(logs in a run directory named in stage 0's `openai_ready` line; a dead child is logged by name,
`child_died`). Either way it is configured from the resolved `--openai-*` options: admission goes
to the broker (written back as flags by `AdmissionOptions.to_flags`, which the broker reads with the
same resolver), the model id, default max tokens, CORS origins and HTTP limits to the adapter; prefill and speculative options
stay with stage 0's driver; the telemetry flags go to both, and the adapter's /dashboard reads the
run directory's metrics-targets.json (stage 0 lists itself there on its own surface). This is the
one launch recipe of the front.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from skippy.config import ConfigError, ServingOptions
from skippy.http.auth import API_KEY_ENV
from skippy.launcher import Children
from skippy.restarts import RESTARTS_FILE
from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import current
from skippy.telemetry.targets import TARGETS_FILE, record_target


def cors_flags(origins: tuple[str, ...]) -> list[str]:
    """The adapter's `--cors-origins` for the resolved `--openai-cors-origins` (none: CORS off)."""
    return ["--cors-origins", ",".join(origins)] if origins else []


def start_front(children: Children, options: ServingOptions, topology: Path) -> str:
    """Start broker + adapter as `children` for the pipeline in `topology`; returns the adapter's URL."""
    openai, cfg = options.openai, options.config
    assert openai is not None
    level = TelemetryOptions.from_serving(options).to_flags()  # every child runs at the stages' telemetry settings
    broker = f"ipc://{children.run_dir}/broker.sock"
    if openai.api_key is not None:  # to broker and adapter by their environment: a command line is visible to anyone
        children.env[API_KEY_ENV] = openai.api_key
    children.start_process("broker", ["broker", "--bind", broker, "--pipeline", str(topology),
                                     *openai.admission.to_flags(), *level, "--metrics-bind", options.metrics_bind])
    events = f"ipc://{children.run_dir}/events.sock"  # token events straight from stage 0 (skippy.driver.direct_events)
    ready = children.start_process("adapter", ["adapter", "--broker", broker, "--events-endpoint", events,
                                       "--model", str(cfg.model_path or "default"),
                                       "--model-id", openai.model_id, "--bind", openai.bind_addr,
                                       "--default-max-tokens", str(openai.default_max_tokens), *level,
                                       *cors_flags(openai.cors_origins), *openai.http.adapter_flags(),
                                       "--metrics-targets", str(children.run_dir / TARGETS_FILE),
                                       "--restarts-file", str(children.run_dir / RESTARTS_FILE)])
    return str(ready["url"])


def start_openai_front(options: ServingOptions) -> tuple[Children, str]:
    """Stage 0's `--openai-bind-addr`: start the front in a fresh run directory; (children, URL)."""
    if options.topology is None:
        raise ConfigError("--openai-bind-addr needs --topology (the broker reaches stage 0 through it)")
    run_dir = Path(tempfile.mkdtemp(prefix=f"skippy-{options.config.stage_id}-openai-"))
    topology = run_dir / "topology.json"
    topology.write_text(options.topology.to_json())
    children = Children(run_dir)
    record_target(run_dir, options.config.stage_id, {"metrics_url": current().metrics_url})
    try:
        return children, start_front(children, options, topology)
    except BaseException:
        children.stop()
        raise
