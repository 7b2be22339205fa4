"""`skippy pipeline TOPOLOGY`: start every stage (downstream first), supervise, Ctrl-C stops all.
`skippy wire TOPOLOGY --delay-ms D [--mbps M]`: change the wire condition of a running pipeline's links."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from skippy.cli.remote_generate import stage_config_paths
from skippy.config import StageTopology, WireCondition
from skippy.config.topology import with_keys_dir
from skippy.launcher import StageProcesses
from skippy.log import configure_logging
from skippy.protocol import SetWire
from skippy.stage.set_wire import send_wire
from skippy.transport.curve_keys import client_link_keys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="start all stages of a topology and supervise them until Ctrl-C",
                       epilog="flags after -- are passed to every `skippy stage`")
    p.add_argument("topology", type=Path, help="topology.json; stage configs are <stage_id>.json beside it")
    p.add_argument("--run-dir", type=Path, default=None, help="where the stages' logs go (default: runs/<time>)")
    p.set_defaults(run=run_pipeline)
    w = sub.add_parser("wire", help="set the wire condition on a running pipeline's downstream links")
    w.add_argument("topology", type=Path)
    w.add_argument("--delay-ms", type=float, required=True)
    w.add_argument("--mbps", type=float, default=None)
    w.add_argument("--stage", action="append", help="only this stage's downstream link (repeatable; default: all)")
    w.set_defaults(run=run_wire)


def run_pipeline(args: argparse.Namespace) -> int:
    topology = StageTopology.load(args.topology)
    flags = list(args.passthrough)
    run_dir = args.run_dir or Path("runs") / time.strftime("pipeline-%Y%m%d-%H%M%S")
    stages = StageProcesses(args.topology, stage_config_paths(args.topology, topology), run_dir, flags, include_stage0=True)
    ready = (f"pipeline {topology.topology_id} ready: {len(topology.stages)} stages, stage 0 at "
             f"{topology.first().endpoint}; logs in {run_dir} (scripts/tail-logs {run_dir}); Ctrl-C stops all")
    return stages.supervise("skippy pipeline", lambda: (stages.start(), ready)[1])


def run_wire(args: argparse.Namespace) -> int:
    WireCondition(delay_ms=args.delay_ms, mbps=args.mbps)  # validate before sending
    configure_logging("off", role="wire")  # warnings (a refused link) to stderr
    topology = with_keys_dir(StageTopology.load(args.topology), args.topology)
    targets = [s for s in topology.stages[:-1] if not args.stage or s.stage_id in args.stage]
    asyncio.run(send_wire([s.endpoint for s in targets], SetWire(args.delay_ms, args.mbps),
                          client_link_keys([topology])))
    print(f"wire condition delay_ms={args.delay_ms} mbps={args.mbps} sent to "
          f"{', '.join(s.stage_id for s in targets)} (see their wire_changed log lines)")
    return 0
