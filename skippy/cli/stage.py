"""`skippy stage --config stage.json [--topology topology.json] [serving flags]`: run one stage process.

Stage 0 runs the driver (scheduler + request endpoint); every later stage runs a StageServer.
"""

from __future__ import annotations

import argparse
import asyncio

from skippy.config import (
    ConfigError,
    MtpSource,
    ServingOptions,
    add_serving_arguments,
    resolve_mtp_source,
    resolve_serving_options,
)
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.models import resolve_model_path
from skippy.log import configure_logging, get_logger
from skippy.runtime.stage_runtime import RuntimeSpec, StageRuntime


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stage", help="run one stage of a pipeline (stage 0 also runs the driver)")
    add_serving_arguments(p)
    p.set_defaults(run=run)


def check_native_mtp(options: ServingOptions) -> MtpSource:
    """Resolve where MTP drafts come from; fail at startup when drafting is asked of a model without
    MTP heads (the default Gemma 3 270M has none). An implicit Integrated source just drafts nothing."""
    source = resolve_mtp_source(options)
    plan = options.openai.speculative if options.openai else None
    asked = source is MtpSource.EXTERNAL or (source is MtpSource.INTEGRATED and plan is not None
                                             and plan.native_mtp.enabled)
    if asked:
        path = resolve_model_path(options.config.model_path)
        gguf = GGUFFile(path)
        heads = gguf.get(f"{gguf.get('general.architecture')}.nextn_predict_layers", 0)
        gguf.close()
        if not heads:
            raise ConfigError(
                f"{path.name}: native MTP drafting ({source.value}) was asked for, but the model has no MTP heads "
                "(nextn_predict_layers is 0); set native_mtp.enabled to false in --openai-speculative-config "
                "or drop --openai-native-mtp-draft-model-path"
            )
        raise ConfigError(f"native MTP drafting ({source.value}) is not implemented yet in skippy")
    return source


def run(args: argparse.Namespace) -> int:
    options = resolve_serving_options(args)
    cfg = options.config
    configure_logging(str(options.telemetry_level), stage_id=cfg.stage_id, stage_index=cfg.stage_index, role="stage")
    log = get_logger()
    mtp = check_native_mtp(options)
    log.info("loading", layer_start=cfg.layer_start, layer_end=cfg.layer_end, model_path=cfg.model_path,
             mtp_source=mtp.value)
    runtime = StageRuntime(RuntimeSpec.from_stage_config(cfg))
    if cfg.stage_index == 0:
        from skippy.cli.front import start_openai_front
        from skippy.driver.process import DriverProcess

        return asyncio.run(DriverProcess(options, runtime, start_openai_front).run())
    from skippy.stage.server import StageServer

    return asyncio.run(StageServer(options, runtime).run())
