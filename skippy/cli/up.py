"""`skippy up`: the whole server from one command — stages (downstream first), broker, adapter.

Default: the packaged Gemma 3 270M split over 2 stages at layer 9 on ipc:// endpoints inside the
run directory, serving http://127.0.0.1:9337. With `--topology`, that topology's stage configs
(<stage_id>.json beside it). Children are supervised: a dead one is reported by name and everything
is stopped; Ctrl-C stops everything cleanly. All logs land in the run directory (scripts/tail-logs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from skippy.cli.adapter import split_host_port
from skippy.cli.remote_generate import stage_config_paths
from skippy.config import StageConfig, StageTopology
from skippy.launcher import StageProcesses, read_events, write_local_topology
from skippy.runtime.models import DEFAULT_MODEL_ID, resolve_model_path
from skippy.runtime.slices import read_model_info

BROKER_FLAGS = ("--openai-generation-concurrency", "--openai-generation-queue-capacity",
                "--openai-generation-admission-timeout-secs", "--openai-adaptive-generation-min-concurrency")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start stages, broker and OpenAI adapter; serve until Ctrl-C",
                       epilog="flags after -- are passed to every `skippy stage`")
    p.add_argument("--topology", type=Path, default=None, help="default: the packaged model split over 2 stages")
    p.add_argument("--model", default="default", help="without --topology: the GGUF to split (default: Gemma 3 270M)")
    p.add_argument("--split", default="9", help="without --topology: split points, e.g. 9 or 5,13")
    p.add_argument("--lane-count", type=int, default=4, help="without --topology: concurrent sessions per stage")
    p.add_argument("--ctx-size", type=int, default=512, help="without --topology: context per session")
    p.add_argument("--bind", default="127.0.0.1:9337", help="HTTP address (default 127.0.0.1:9337)")
    p.add_argument("--run-dir", type=Path, default=None, help="logs and sockets (default: runs/up-<time>)")
    p.add_argument("--openai-model-id", default=None)
    p.add_argument("--openai-default-max-tokens", type=int, default=16)
    for flag in BROKER_FLAGS:
        p.add_argument(flag, default=None)
    p.add_argument("--openai-adaptive-generation-concurrency", action="store_true")
    p.set_defaults(run=run)


def _topology(args: argparse.Namespace, run_dir: Path) -> tuple[Path, list[Path], str, str]:
    if args.topology is not None:
        topology = StageTopology.load(args.topology)
        configs = stage_config_paths(args.topology, topology)
        first = StageConfig.load(configs[0])
        return args.topology, configs, str(first.model_path or "default"), topology.model_id
    model = resolve_model_path(args.model)
    splits = [int(x) for x in args.split.split(",") if x.strip()]
    model_id = DEFAULT_MODEL_ID if args.model == "default" else model.stem
    topology, configs = write_local_topology(run_dir / "topology", model, read_model_info(model).n_layer, splits,
                                             lane_count=args.lane_count, ctx_size=args.ctx_size, model_id=model_id)
    return topology, configs, str(model), model_id


def run(args: argparse.Namespace) -> int:
    split_host_port(args.bind, "--bind")
    run_dir = (args.run_dir or Path("runs") / time.strftime("up-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    topology, configs, model, model_id = _topology(args, run_dir)
    children = StageProcesses(topology, configs, run_dir, list(args.passthrough), include_stage0=True)
    broker_endpoint = f"ipc://{run_dir}/broker.sock"
    broker_flags = [x for flag in BROKER_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None
                    for x in (flag, getattr(args, flag[2:].replace("-", "_")))]
    if args.openai_adaptive_generation_concurrency:
        broker_flags.append("--openai-adaptive-generation-concurrency")
    served = args.openai_model_id or model_id

    def start() -> str:
        print(f"starting {len(configs)} stages, broker and adapter (logs: {run_dir})", file=sys.stderr, flush=True)
        children.start()
        children.start_process("broker", ["broker", "--bind", broker_endpoint, "--pipeline", str(topology), *broker_flags])
        children.start_process("adapter", ["adapter", "--broker", broker_endpoint, "--model", model, "--model-id",
                                           served, "--bind", args.bind,
                                           "--default-max-tokens", str(args.openai_default_max_tokens)])
        url = next((e["url"] for e in read_events(children.log_path("adapter")) if e.get("event") == "ready"), None)
        return f"skippy ready: {url}/v1 (model {served}); logs: scripts/tail-logs {run_dir}; Ctrl-C stops everything"

    return children.supervise("skippy up", start)
