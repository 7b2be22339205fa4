"""`skippy stage --config stage.json [--topology topology.json] [serving flags]`: run one stage process.

Stage 0 runs the driver (scheduler + request endpoint); every later stage runs a StageServer. A flag
whose feature is not built yet fails here, before the model loads (`refuse_unsupported`).
"""

from __future__ import annotations

import argparse
import asyncio

from skippy.config import add_serving_arguments, refuse_unsupported, resolve_mtp_source, resolve_serving_options
from skippy.log import configure_logging, get_logger
from skippy.runtime.stage_runtime import RuntimeSpec, StageRuntime


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stage", help="run one stage of a pipeline (stage 0 also runs the driver)")
    add_serving_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = resolve_serving_options(args)
    refuse_unsupported(options)
    cfg = options.config
    configure_logging(str(options.telemetry_level), stage_id=cfg.stage_id, stage_index=cfg.stage_index, role="stage")
    log = get_logger()
    mtp = resolve_mtp_source(options)
    log.info("loading", layer_start=cfg.layer_start, layer_end=cfg.layer_end, model_path=cfg.model_path,
             mtp_source=mtp.value)
    runtime = StageRuntime(RuntimeSpec.from_stage_config(cfg))
    if cfg.stage_index == 0:
        from skippy.cli.front import start_openai_front
        from skippy.driver.process import DriverProcess

        return asyncio.run(DriverProcess(options, runtime, start_openai_front).run())
    from skippy.stage.server import StageServer

    return asyncio.run(StageServer(options, runtime).run())
