"""Benchmarks, not tests: `skippy bench KIND` (and the `scripts/bench-*` wrappers around it).

Speed is measured here, never in tests: each kind runs what it compares side by side in one run
(alternating rounds where it can, so machine noise hits both sides alike) and reports ratios, with
the target each ratio is held to. Tests check behaviour; a timing assertion in a test only measures
the machine it ran on. This package sits just below `skippy.cli` (which only registers the verb) and
never imports it.

The kinds (`skippy bench KIND --help` for the flags):

- `runtime` (runtime.py): the 2-slice chain against unsplit llama.cpp, prefill, decode, peak RSS per slice.
- `pipeline` (pipeline.py): 2 stages (stage 1 a real process) against unsplit llama.cpp: per-token
  overhead, one token's timeline (timeline.py), the bare llama.cpp + ZeroMQ floor (floor.py), 8 and
  16 streams, wire delay, long-prompt TTFT; `--pin` (pipeline_pin.py): stages sharing cores vs pinned.
- `http` (http.py, http_load.py, http_servers.py, http_report.py, llama_server_build.py): `skippy up`
  against llama-cpp-python's server and llama.cpp's `llama-server` over HTTP; `--order` alternates the
  servers level by level or runs them one after the other.
- `plan` (plan.py): skippy split by the planner over pinned CPU sets against llama-server on one of them,
  the planner's prediction next to each measurement.
- `soak` (soak.py): the driver's memory over many requests, which must stay flat.
- `speculative` (speculative.py, speculative_load.py, speculative_report.py): plain vs speculative decoding.
- `prefix-cache` (prefix_cache.py, prefix_cache_report.py): the prefix cache on vs off.
- `telemetry` (telemetry.py): decode speed with a stalled or unreachable OTLP collector vs none.
- `codec` (codec.py): the protocol codec on one decode step's messages, cold and warm caches.
- `deterministic` (deterministic.py): `skippy up --deterministic` against without it (docs/deterministic.md).

Over namespace hosts (root), outside the verb: `python -m skippy.bench.netns latency|pipelining|dtype`
(`scripts/bench-netns`; netns.py, netns_dtype.py, netns_pipeline.py).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `bench` verb and its kinds to the `skippy` command's subparsers."""
    from skippy.bench import (
        codec,
        deterministic,
        http,
        pipeline,
        plan,
        prefix_cache,
        runtime,
        soak,
        speculative,
        telemetry,
    )

    p = sub.add_parser("bench", help="benchmarks (not tests): ratios measured side by side in one run")
    kinds = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in (runtime, pipeline, http, plan, soak, speculative, prefix_cache, telemetry, codec, deterministic):
        module.add_to(kinds)
