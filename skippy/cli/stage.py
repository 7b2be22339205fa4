"""`skippy stage --config stage.json [--topology topology.json] [serving flags]`: run one stage process.

Stage 0 runs the driver (scheduler + request endpoint); every later stage runs a StageServer. A flag
whose feature is not built yet fails here, before the model loads (`refuse_unsupported`), and so does
a topology on non-loopback addresses without link keys unless `--insecure-links` (then logged as a
warning). With keys (`skippy keys --topology T`) every socket of the process is CURVE (skippy.transport.curve_guard). With
`--cpu-affinity` / `--stage-cpus` every thread of the process is pinned first, before the model loads
and before llama.cpp starts a thread, so its default thread count is the number of pinned CPUs.
Its telemetry starts before the model loads: /metrics served on `--metrics-bind` (default loopback;
the URL is in its `ready` line) behind the API key when one is set (`$SKIPPY_OPENAI_API_KEY`, or stage
0's own front's key), spans to `--metrics-otlp-grpc` (skippy.telemetry).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import replace
from typing import Any

import zmq

from skippy.config import FlagReader, add_serving_arguments, refuse_unsupported, resolve_mtp_source, resolve_serving_options
from skippy.config.api_key import COMMAND_LINE_WARNING
from skippy.config.cpu_sets import format_cpu_list
from skippy.cpu_pinning import pin_process
from skippy.log import configure_logging, get_logger
from skippy.plan.memory import MIB, ServingShape, kv_scale, refuse_if_too_big
from skippy.runtime.context_size import spec_context
from skippy.runtime.models import resolve_model_path
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import start_telemetry
from skippy.transport.curve_guard import LinkKeys, secure
from skippy.transport.curve_keys import stage_link_keys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stage", help="run one stage of a pipeline (stage 0 also runs the driver)")
    add_serving_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = resolve_serving_options(args)
    refuse_unsupported(options)
    cfg = options.config
    pinned = pin_process(options.cpu_affinity) if options.cpu_affinity else ()
    configure_logging(str(options.telemetry_level), stage_id=cfg.stage_id, stage_index=cfg.stage_index, role="stage")
    api_key = options.openai.api_key if options.openai is not None else None  # None: $SKIPPY_OPENAI_API_KEY
    start_telemetry(TelemetryOptions.from_serving(options), "driver" if cfg.stage_index == 0 else "stage",
                    options.bind_addr, metrics_bind=options.metrics_bind, api_key=api_key)
    log = get_logger()
    if FlagReader(args).given("--openai-api-key"):
        log.warning("api_key_on_command_line", error=COMMAND_LINE_WARNING)
    keys = stage_link_keys(options)  # a bad key file fails here, before the model loads
    if options.insecure_links:
        log.warning("insecure_links", error="--insecure-links: this stage's links are plain ZeroMQ, neither "
                    "authenticated nor encrypted; anyone who reaches its address can feed it", bind_addr=options.bind_addr,
                    keyed=keys is not None)
    mtp = resolve_mtp_source(options)
    log.info("loading", layer_start=cfg.layer_start, layer_end=cfg.layer_end, model_path=cfg.model_path,
             mtp_source=mtp.value, cpu_affinity=format_cpu_list(pinned) if pinned else "all",
             openmp_spin=os.environ.get("GOMP_SPINCOUNT"))  # skippy.openmp: chosen by whoever started the stage
    spec = replace(RuntimeSpec.from_stage_config(cfg), mtp=mtp.value,  # used by a final stage (docs/mtp.md)
                   mtp_draft_model=options.speculative.native_mtp_draft_model_path)
    size = spec_context(spec)  # ctx_size and kv_pool_cells 0: decided from the model and this host's memory
    spec = replace(spec, ctx_size=size.ctx_size, kv_pool_cells=size.kv_pool_cells)
    log.info("context_sized", **size.fields())
    if size.over_trained:  # allowed, as llama-server allows it
        log.warning("context_over_trained", ctx_size=size.ctx_size, n_ctx_train=size.n_ctx_train,
                    error="ctx_size exceeds the context the model was trained with: possible training context overflow")
    if spec.load_mode == "runtime-slice" and spec.model_path is not None:  # a host's memory budget, before loading
        shape = ServingShape(spec.lane_count, spec.ctx_size, spec.prefix_entries > 0,
                             kv_scale(spec.cache_type_k, spec.cache_type_v), spec.kv_pool_cells)
        need = refuse_if_too_big(resolve_model_path(spec.model_path), spec.layer_start, spec.layer_end, shape, cfg.stage_id)
        log.info("memory_predicted", mib=round(need.total / MIB), detail=need.describe())
    runtime = StageRuntime(spec)
    if runtime.mtp_off:  # asked for native MTP, but the final slice has no NextN block: no drafts
        log.warning("native_mtp_off", reason=runtime.mtp_off)
    elif runtime.mtp is not None:
        log.info("native_mtp", mtp_source=mtp.value, model_path=str(runtime.mtp.model.path))
    if runtime.prefix_cache_off:  # a recurrent family: its prefix cache cannot be exact, so it is not kept
        log.warning("prefix_cache_off", reason=runtime.prefix_cache_off)
    if cfg.stage_index == 0:
        from skippy.cli.front import start_openai_front
        from skippy.driver.process import DriverProcess

        driver = DriverProcess(options, runtime, start_openai_front)
        _secure(driver.driver.ctx, keys)
        return asyncio.run(driver.run())
    from skippy.stage.server import StageServer

    server = StageServer(options, runtime)
    _secure(server.ctx, keys)
    return asyncio.run(server.run())


def _secure(ctx: zmq.Context[Any], keys: LinkKeys | None) -> None:
    """CURVE on every socket of the process's context (before any is opened) when its topology has keys."""
    if keys is not None:
        secure(ctx, keys)
