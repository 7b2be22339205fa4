"""The OpenAI front of a pipeline: the broker and the adapter, started as supervised child processes.

Two surfaces start it. `skippy up` starts it next to the stages it launches; the reference's
stage-0 surface, `skippy stage ... --openai-bind-addr`, makes stage 0 start it as its own children
(logs in a run directory named in stage 0's `openai_ready` line; a dead child is logged by name,
`child_died`). Either way it is configured from the resolved `--openai-*` options: admission goes
to the broker (written back as flags by `AdmissionOptions.to_flags`, which the broker reads with the
same resolver), the model id and default max tokens to the adapter; prefill and speculative options
stay with stage 0's driver. This is the one launch recipe of the front.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from skippy.config import ConfigError, ServingOptions
from skippy.launcher import Children


def start_front(children: Children, options: ServingOptions, topology: Path) -> str:
    """Start broker + adapter as `children` for the pipeline in `topology`; returns the adapter's URL."""
    openai, cfg = options.openai, options.config
    assert openai is not None
    level = ["--telemetry-level", str(options.telemetry_level)]
    broker = f"ipc://{children.run_dir}/broker.sock"
    children.start_process("broker", ["broker", "--bind", broker, "--pipeline", str(topology),
                                     *openai.admission.to_flags(), *level])
    ready = children.start_process("adapter", ["adapter", "--broker", broker, "--model", str(cfg.model_path or "default"),
                                       "--model-id", openai.model_id, "--bind", openai.bind_addr,
                                       "--default-max-tokens", str(openai.default_max_tokens), *level])
    return str(ready["url"])


def start_openai_front(options: ServingOptions) -> tuple[Children, str]:
    """Stage 0's `--openai-bind-addr`: start the front in a fresh run directory; (children, URL)."""
    if options.topology is None:
        raise ConfigError("--openai-bind-addr needs --topology (the broker reaches stage 0 through it)")
    run_dir = Path(tempfile.mkdtemp(prefix=f"skippy-{options.config.stage_id}-openai-"))
    topology = run_dir / "topology.json"
    topology.write_text(options.topology.to_json())
    children = Children(run_dir)
    try:
        return children, start_front(children, options, topology)
    except BaseException:
        children.stop()
        raise
