"""Benchmarks, not tests: `skippy bench KIND` (and the `scripts/bench-*` wrappers around it).

Speed is measured here, never in tests: each kind runs what it compares side by side in one run
(alternating rounds where it can, so machine noise hits both sides alike) and reports ratios, with
the target each ratio is held to. Tests check behaviour; a timing assertion in a test only measures
the machine it ran on. This package sits just below `skippy.cli` (which only registers the verb) and
never imports it.

The kinds (`skippy bench KIND --help` for the flags), each with its modules:

- `runtime` (`runtime.py`): the 2-slice chain against unsplit llama.cpp, prefill, decode, peak RSS per slice.
- `pipeline` (`pipeline.py`): 2 stages (stage 1 a real process) against unsplit llama.cpp: per-token
  overhead, one token's timeline (`timeline.py`), the bare llama.cpp + ZeroMQ floor (`floor.py`), 8 and
  16 streams, wire delay, long-prompt TTFT; `--pin` (`pipeline_pin.py`): stages sharing cores vs pinned;
  `streams.py`: the row type, prompts and decode rate both share.
- `http` (`http.py`; `http_load.py` the measurement, `http_servers.py` the servers, `http_report.py` the
  report, `llama_server_build.py` llama.cpp's `llama-server` built once): `skippy up` against
  llama-cpp-python's server and `llama-server` over HTTP; `--order` alternates the servers level by
  level or runs them one after the other.
- `plan` (`plan.py`): skippy split by the planner over pinned CPU sets against llama-server on one of them,
  the planner's prediction next to each measurement.
- `prefill` (`prefill.py`; `prefill_load.py` the prompts and their timing, `prefill_timeline.py` a prompt's
  chunks stage by stage): a long prompt's TTFT, skippy one host vs llama-server on the same cores, and skippy
  over one-core stages vs llama-server on one core.
- `soak` (`soak.py`): the driver's memory over many requests, which must stay flat.
- `speculative` (`speculative.py`; `speculative_workloads.py` the prompts, `speculative_load.py` the rounds
  and their timing, `speculative_peers.py` llama-server with and without its own drafting,
  `speculative_latency.py` the serving-latency table, `speculative_report.py` the report): plain vs
  speculative decoding.
- `prefix-cache` (`prefix_cache.py`, `prefix_cache_report.py`): the prefix cache on vs off.
- `telemetry` (`telemetry.py`): decode speed with a stalled or unreachable OTLP collector vs none.
- `codec` (`codec.py`): the protocol codec on one decode step's messages, cold and warm caches.
- `deterministic` (`deterministic.py`): `skippy up --deterministic` against without it (docs/deterministic.md).
- `agents` (`agent_first_answer.py`; `agent_client_launch.py` the real clients' environment and one run of one,
  which tests/openai's client tests share): Codex CLI and Claude Code against plain `skippy up`, each one's wall
  time to its first answer, first request's prompt and cached tokens and TTFT, with a cold then a warm prefix cache.

- `hosts` (`hosts.py`; `hosts_measure.py` the measurements, `hosts_rpc.py` llama.cpp's RPC split, the peer): one model
  across namespace hosts reached only over SSH (root): skippy against llama.cpp's RPC split over the same hosts,
  time to ready, bytes each host received, tok/s, a long prompt's TTFT, and streams in flight when a host is cut off.

`cpu_time.py`: the CPU time a server's processes spend per output token, by role (the http and plan benches).

Outside the verb: `python -m skippy.bench.mtp` (`mtp.py`: plain greedy vs verifying native-MTP drafts,
docs/mtp.md), and over namespace hosts (root) `python -m skippy.bench.netns latency|pipelining|dtype`
(`scripts/bench-netns`; `netns.py`, `netns_dtype.py`, and `netns_pipeline.py`, what both share).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `bench` verb and its kinds to the `skippy` command's subparsers."""
    from skippy.bench import (
        agent_first_answer,
        codec,
        deterministic,
        hosts,
        http,
        pipeline,
        plan,
        prefill,
        prefix_cache,
        runtime,
        soak,
        speculative,
        telemetry,
    )

    p = sub.add_parser("bench", help="benchmarks (not tests): ratios measured side by side in one run")
    kinds = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in (runtime, pipeline, http, plan, prefill, soak, speculative, prefix_cache, telemetry, codec,
                   deterministic, agent_first_answer, hosts):
        module.add_to(kinds)
