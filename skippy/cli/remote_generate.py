"""`skippy generate --topology T`: generate over real stage processes through stage 0's request endpoint."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from skippy.client import PipelineClient
from skippy.config import StageConfig, StageTopology
from skippy.config.topology import with_keys_dir
from skippy.launcher import StageProcesses
from skippy.log import configure_logging
from skippy.request_events import PipelineUnavailable
from skippy.runtime.models import resolve_model_path
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.tokenizer import IncrementalDecoder, Tokenizer
from skippy.transport.curve_guard import LinkKeys, secured_context
from skippy.transport.curve_keys import client_link_keys
from skippy.transport.endpoints import request_endpoint


def stage_config_paths(topology_path: Path, topology: StageTopology) -> list[Path]:
    paths = [topology_path.parent / f"{stage.stage_id}.json" for stage in topology.stages]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"stage configs not found next to {topology_path}: {', '.join(missing)}")
    return paths


async def _stage0_answers(endpoint: str, keys: LinkKeys | None) -> bool:
    with secured_context(keys) as ctx:
        client = PipelineClient(endpoint, ctx)
        try:
            await client.status(timeout_s=0.5)
            return True
        except PipelineUnavailable:
            return False
        finally:
            client.close()


async def _generate(endpoint: str, keys: LinkKeys | None, tokenizer: Tokenizer, prompt: str, max_tokens: int,
                    sampling: SamplingParams) -> int:
    with secured_context(keys) as ctx:
        return await _stream(PipelineClient(endpoint, ctx), tokenizer, prompt, max_tokens, sampling)


async def _stream(client: PipelineClient, tokenizer: Tokenizer, prompt: str, max_tokens: int,
                  sampling: SamplingParams) -> int:
    try:
        status = await client.status(timeout_s=10.0)
        if not status.ready:
            raise PipelineUnavailable(f"pipeline not ready: stage {status.dead_stage} is down")
        ids = tokenizer.encode(prompt)
        handle = await client.submit(ids, sampling, max_tokens, tokenizer.eog_tokens())
        decoder = IncrementalDecoder(tokenizer)
        sys.stdout.write(prompt)
        start, n = time.perf_counter(), 0
        async for event in handle:
            if event.tokens:
                n += len(event.tokens)
                sys.stdout.write("".join(decoder.push(token) for token in event.tokens))
                sys.stdout.flush()
            elif event.finish_reason == "error":
                raise PipelineUnavailable(f"generation failed: {event.error}")
        sys.stdout.write(decoder.flush() + "\n")
        elapsed = time.perf_counter() - start
        print(f"generated {n} tokens in {elapsed:.2f} s ({n / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
        return 0
    finally:
        client.close()


def run_over_topology(args: argparse.Namespace, sampling: SamplingParams) -> int:
    configure_logging("off", role="generate")  # warnings (a refused link) to stderr; stdout is the text
    topology = with_keys_dir(StageTopology.load(args.topology), args.topology)
    keys = client_link_keys([topology])  # CURVE toward stage 0 when the topology names keys
    configs = stage_config_paths(args.topology, topology)
    endpoint = request_endpoint(topology.first().endpoint)
    model = StageConfig.load(configs[0]).model_path
    tokenizer = Tokenizer(resolve_model_path(model))
    stages: StageProcesses | None = None
    try:
        if not asyncio.run(_stage0_answers(endpoint, keys)):
            run_dir = args.run_dir or Path("runs") / time.strftime("generate-%Y%m%d-%H%M%S")
            print(f"starting {len(configs)} stage processes (logs: {run_dir})", file=sys.stderr)
            stages = StageProcesses(args.topology, configs, run_dir, include_stage0=True).start()
        return asyncio.run(_generate(endpoint, keys, tokenizer, args.prompt, args.max_tokens, sampling))
    finally:
        if stages is not None:
            stages.stop()
        tokenizer.close()
