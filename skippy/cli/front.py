"""The reference's stage-0 surface: `skippy stage ... --openai-bind-addr` also serves the OpenAI API.

Design: stage 0 starts the broker and the adapter as its own supervised child processes (the same
programs `skippy up` runs), configured from the `--openai-*` flags: admission flags go to the
broker, the model id and default max tokens to the adapter; prefill and speculative flags stay with
the driver in the stage-0 process. Their logs go to a run directory named in stage 0's `openai_ready`
line; a dead child is logged by name (`child_died`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from skippy.config import ConfigError, ServingOptions
from skippy.launcher import Children, read_events


def start_openai_front(options: ServingOptions) -> tuple[Children, str]:
    """Start broker + adapter for this pipeline; returns the children and the adapter's URL."""
    openai, cfg = options.openai, options.config
    assert openai is not None
    if options.topology is None:
        raise ConfigError("--openai-bind-addr needs --topology (the broker reaches stage 0 through it)")
    run_dir = Path(tempfile.mkdtemp(prefix=f"skippy-{cfg.stage_id}-openai-"))
    topology = run_dir / "topology.json"
    topology.write_text(options.topology.to_json())
    admission = openai.admission
    broker_flags = ["--openai-generation-concurrency", str(admission.generation_concurrency),
                    "--openai-generation-queue-capacity", str(admission.queue_capacity),
                    "--openai-generation-admission-timeout-secs", str(admission.admission_timeout_secs)]
    if admission.adaptive:
        broker_flags += ["--openai-adaptive-generation-concurrency",
                         "--openai-adaptive-generation-min-concurrency", str(admission.adaptive_min_concurrency or 1)]
    broker = f"ipc://{run_dir}/broker.sock"
    children = Children(run_dir)
    try:
        children.start_process("broker", ["broker", "--bind", broker, "--pipeline", str(topology), *broker_flags])
        children.start_process("adapter", ["adapter", "--broker", broker, "--model", str(cfg.model_path or "default"),
                                           "--model-id", openai.model_id, "--bind", openai.bind_addr,
                                           "--default-max-tokens", str(openai.default_max_tokens)])
    except BaseException:
        children.stop()
        raise
    url = next((str(e["url"]) for e in read_events(children.log_path("adapter")) if e.get("event") == "ready"), "")
    return children, url
