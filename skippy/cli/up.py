"""`skippy up`: the whole server from one command — stages (downstream first), broker, adapter.

Default: the packaged Qwen2.5-Coder-0.5B-Instruct (skippy.runtime.models; `--model smollm2-135m`,
`gemma3-270m`, `qwen2.5-coder-1.5b`, or a GGUF path) on ipc:// endpoints inside the run directory, serving
http://127.0.0.1:9337: with hosts given (`--stage-cpus LIST`: one stage per CPU set; `--hosts FILE`
or `--netns PREFIX`: as many as pay) at the split `skippy plan` picks for them (skippy.plan, its report on
stderr), else at `--split`, else as the plan for one host: the model whole in one stage (with a link flag,
`--downstream-wire-delay-ms` and the like, the layers halved: 12 of the default's 24, 9 of Gemma's 18); with the prefix cache on
(`--no-prefix-cache` turns it off): `kv_cache` mode lookup-record, 4 entries per lane, outside the lanes' KV pool in
at most its bytes (max_bytes 0), each request's context the model's trained one and the pool a context per lane,
both bounded by memory (`--ctx-size`, `--kv-pool-cells`: skippy.runtime.context_size, decided here once for every
stage). With
`--topology`, that topology's stage configs
(<stage_id>.json beside it); `--topology` repeated serves each as a replica, a pipeline of its own behind the
one broker (its least-loaded routing spreads the streams), as a replicated plan does: `skippy plan` weighs
replicas when every host holds the whole model (`--no-replicas`: splits only), and `--stage-cpus` then names one
CPU set per stage of every pipeline in turn (each pipeline's own share goes to its stages). `skippy up` takes
every serving flag of `skippy stage` except the per-stage files and sockets, resolves them as stage 0 with an
OpenAI front would (so a bad or unsupported flag fails before anything starts) and hands each to its owner:
stage flags to every stage, prefill and speculative flags to stage 0, admission flags to the broker, the model
id and default max tokens to the adapter. The API key ($SKIPPY_OPENAI_API_KEY, `--openai-api-key-file`, or
`--openai-api-key`, which stays on this command line and is warned about) reaches every child through its
environment, never a command line: the adapter's routes and every /metrics want it. A non-loopback `--bind`
without a key is warned about (here and in the adapter's log). Children are supervised: any child that dies (a
stage, stage 0 included, the broker, the adapter) is restarted with backoff (skippy.restarts,
`--max-stage-restarts`, which also bounds deaths in a row before everything is stopped); the adapter comes back on the same
port; an SSH host lost for good is dropped and the model re-planned over the hosts left (skippy.remote.host_loss).
Ctrl-C stops everything cleanly. All logs land in the run directory. A flag that the layout asked for
would not read (`--split` with `--topology`, a plan flag where nothing is planned: skippy.cli.unused_flags) is
refused before anything starts.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from skippy.cli.front import FrontProcesses
from skippy.cli.plan import add_host_arguments, hosts_given, hosts_memory, model_id_of, plan_for
from skippy.cli.remote_generate import stage_config_paths
from skippy.cli.unused_flags import StoreGiven, refuse_unused_up_flags
from skippy.config import (
    ConfigError,
    FlagReader,
    Owner,
    ServingOptions,
    StageTopology,
    add_serving_arguments,
    parse_serving_args,
    refuse_unsupported,
)
from skippy.config.api_key import API_KEY_ENV, COMMAND_LINE_WARNING, api_key_from, open_bind_warning
from skippy.config.cpu_sets import CpuSet, parse_cpu_list
from skippy.config.endpoint import normalize_http_addr
from skippy.config.serving_args import flag_owner
from skippy.launcher import PipelineFiles, StageProcesses, default_kv_cache, write_local_topology
from skippy.plan.hosts import Host
from skippy.plan.write import write_plan
from skippy.remote.host_loss import HostLossRestarter
from skippy.remote.ssh_stages import ssh_stages
from skippy.restarts import RESTARTS_FILE, RestartPolicy, StageRestarter
from skippy.runtime.context_size import flag_context
from skippy.runtime.models import PACKAGED, model_id_for, resolve_model_path
from skippy.runtime.mtp import sidecar_refusal
from skippy.runtime.slices import read_model_info

UP_OWNERS = (Owner.EVERY_STAGE, Owner.STAGE0, Owner.BROKER, Owner.ADAPTER)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start stages, broker and OpenAI adapter; serve until Ctrl-C",
                       epilog="flags after -- are passed to every `skippy stage`")
    p.add_argument("--topology", type=Path, action="append", default=None,
                   help="a topology to serve (default: the packaged model, planned for this host); repeat it to serve"
                        " replicas behind one broker")
    p.add_argument("--model", default="default", action=StoreGiven,
                   help=f"without --topology: a packaged model ({', '.join(PACKAGED)}) or a GGUF path to split"
                        " (default: qwen2.5-coder-0.5b, Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--split", default=None,
                   help="without --topology: split points, e.g. 9 or 5,13, or none: one stage (default: planned for the"
                        " hosts given by --stage-cpus / --hosts / --netns, else one stage: one host is not split)")
    p.add_argument("--lane-count", type=int, default=4, action=StoreGiven,
                   help="without --topology: concurrent sessions per stage")
    p.add_argument("--ctx-size", type=int, default=0, action=StoreGiven,
                   help="without --topology: context per request, prompt and reply (default 0: the model's trained"
                        " context, bounded by memory; above it is allowed, as llama-server allows it)")
    p.add_argument("--kv-pool-cells", type=int, default=0, action=StoreGiven,
                   help="without --topology: KV cells the lanes share, so one long request can use what idle lanes do"
                        " not; a request waits until its prompt's cells are free (default 0: a context per lane, at"
                        " most 1/8 of the memory)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="without --topology: no prefix cache (kv_cache null); default: on")
    p.add_argument("--bind", default="127.0.0.1:9337", help="HTTP address (default 127.0.0.1:9337)")
    p.add_argument("--run-dir", type=Path, default=None, help="logs and sockets (default: runs/up-<time>)")
    p.add_argument("--max-stage-restarts", type=int, default=RestartPolicy.max_restarts, metavar="N",
                   help="a child that dies (any stage, the broker, the adapter) is restarted, with backoff, up to N"
                        f" times in a row (default {RestartPolicy.max_restarts}; 0: a dead child stops everything)")
    add_serving_arguments(p, UP_OWNERS)
    add_host_arguments(p)
    p.set_defaults(run=run)


def _pipelines(args: argparse.Namespace, run_dir: Path) -> list[PipelineFiles]:
    """What to serve: the given topologies, the plan for the hosts given, or the model split at `--split`; each
    pipeline with its share of `--stage-cpus` (which then no longer goes to every stage)."""
    if args.topology:
        pipelines = [PipelineFiles(t, stage_config_paths(t, StageTopology.load(t))) for t in args.topology]
        _refuse_shared_stage_ids(args.topology)
    else:
        pipelines = _split_or_planned(args, run_dir)
    stage_cpus = FlagReader(args).text("--stage-cpus")
    if stage_cpus is None:
        return pipelines
    sets = stage_cpus.split(",")
    if len(sets) != sum(len(p.configs) for p in pipelines):
        names = " + ".join(f"{len(p.configs)} in {p.topology}" for p in pipelines)
        raise ConfigError(f"--stage-cpus must give one CPU set per stage ({names}), got {len(sets)}: '{stage_cpus}'")
    shares, start = [], 0
    for p in pipelines:
        shares.append(replace(p, stage_cpus=",".join(sets[start:start + len(p.configs)])))
        start += len(p.configs)
    return shares


def _refuse_shared_stage_ids(topologies: list[Path]) -> None:
    """Replicas' stages run side by side, each named by its stage id (its process, log and restarts)."""
    seen: dict[str, Path] = {}
    for path in topologies:
        for stage in StageTopology.load(path).stages:
            if stage.stage_id in seen:
                raise ConfigError(f"--topology {path}: stage id '{stage.stage_id}' is also in --topology"
                                  f" {seen[stage.stage_id]}; replicas need distinct stage ids (`skippy plan --out`"
                                  " writes replica<i>-stage<j>)")
            seen[stage.stage_id] = path


def _split_or_planned(args: argparse.Namespace, run_dir: Path) -> list[PipelineFiles]:
    model = resolve_model_path(args.model)
    extra: dict[str, object] = {"kv_cache": default_kv_cache(args.lane_count) if args.prefix_cache else None,
                                **_context(args, model)}
    if args.split is None and hosts_given(args):
        return _planned(args, run_dir, extra)
    n_layer = read_model_info(model).n_layer
    if args.split == WHOLE:
        splits: list[int] = []
    elif args.split:
        splits = _split_points(args.split, n_layer)
    else:  # one host: the model whole, or halved when a link flag asks for a link
        splits = [] if _one_host_link(args) is None else [n_layer // 2]
    return [PipelineFiles(*write_local_topology(run_dir / "topology", model, n_layer, splits, lane_count=args.lane_count,
                                                ctx_size=args.ctx_size, model_id=model_id_for(args.model, model),
                                                extra=extra))]


def _context(args: argparse.Namespace, model: Path) -> dict[str, object]:
    """Every stage's context and KV pool, decided once here from the model and this host's memory (stage 0 admits
    into the pool every stage holds): `args.ctx_size` set for the topology, the pool for the stage configs."""
    deterministic = FlagReader(args).switch("--deterministic") or "--deterministic" in args.passthrough
    memory = hosts_memory(args) if args.split is None else None  # planned hosts: the smallest one's
    size = flag_context(model, args.lane_count, args.ctx_size, args.kv_pool_cells, deterministic, memory)
    args.ctx_size = size.ctx_size
    if not deterministic:  # (where each lane has a context of its own: a pool given is refused by the stages)
        args.kv_pool_cells = size.kv_pool_cells
    args.context_note = size.describe(args.lane_count)  # said once the flags are known good (a refusal is one line)
    return {"kv_pool_cells": args.kv_pool_cells}


WHOLE = "none"  # --split none: the model whole in one stage
# Flags describing a link between stages: given without --split, they ask for a split to put a link in.
LINK_FLAGS = ("--downstream-wire-delay-ms", "--downstream-wire-mbps", "--activation-wire-dtype")


def _split_points(text: str, n_layer: int) -> list[int]:
    """`--split 9` / `5,13`: rising layer numbers inside the model (each stage gets at least one layer)."""
    try:
        points = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        points = []
    if not points or points != sorted(set(points)) or points[0] < 1 or points[-1] >= n_layer:
        raise ConfigError(f"--split must be rising layer numbers between 1 and {n_layer - 1} separated by commas"
                          f" (the model has {n_layer} layers), or {WHOLE} for one stage; got '{text}'")
    return points


def _one_host_link(args: argparse.Namespace) -> str | None:
    """No --split and no hosts: this machine is the one host, and the plan for one host is the model whole in one
    stage (a split there only adds hops: docs/bench-http.md); a link flag given asks for a link: the layers halved."""
    flags = FlagReader(args)
    passed = {arg.split("=", 1)[0] for arg in args.passthrough}  # flags after --
    return next((flag for flag in LINK_FLAGS if flags.given(flag) or flag in passed), None)


def _layout_note(args: argparse.Namespace) -> str | None:
    """What plain `skippy up` chose on one host, and why (said once the flags are known good: a refusal is one line)."""
    if args.topology or args.split is not None or hosts_given(args):
        return None
    link = _one_host_link(args)
    if link is None:
        return "one host (no --split, --stage-cpus, --hosts or --netns): the model whole in one stage; `--split N` splits it"
    return f"{link} describes a link between stages: the layers halved (`--split N` chooses)"


def _planned(args: argparse.Namespace, run_dir: Path, extra: dict[str, object],
             hosts: list[Host] | None = None) -> list[PipelineFiles]:
    """The split (or replicas) skippy.plan picks for the hosts given (`--stage-cpus`: one stage per CPU set); `hosts`:
    a split over these, written over the first (`args.replan`, for skippy.remote.host_loss)."""
    stage_cpus = FlagReader(args).text("--stage-cpus")
    plan = plan_for(args, stages=len(stage_cpus.split(",")) if stage_cpus else None, replicate=hosts is None, hosts=hosts)
    print(plan.report(), file=sys.stderr, flush=True)
    written = write_plan(plan, run_dir / "topology", model_id=model_id_of(args.model), extra=extra)
    args.replan = lambda left: _planned(args, run_dir, extra, left)
    pinned = [p.stage_cpus for p in written.pipelines]
    if stage_cpus is None and all(pinned):
        args.stage_cpus = ",".join(c for c in pinned if c)  # each stage pinned to its host's CPUs
    return list(written.pipelines)


def _cpu_sets(pipeline: PipelineFiles) -> list[CpuSet]:
    """Each stage's CPUs from the pipeline's `--stage-cpus` share (none: every CPU)."""
    if pipeline.stage_cpus is None:
        return [() for _ in pipeline.configs]
    return [parse_cpu_list(entry, "+") for entry in pipeline.stage_cpus.split(",")]


def stage0_options(args: argparse.Namespace, topology: Path, config: Path) -> ServingOptions:
    """Stage 0's options with the front at `--bind`, as `skippy stage` would resolve them; refuses
    what `skippy stage` would refuse, so nothing starts with a bad or unsupported flag."""
    try:
        normalize_http_addr(args.bind)
    except ValueError as error:
        raise ConfigError(f"--bind {error}") from None
    for arg in args.passthrough:
        owner = flag_owner(arg.split("=", 1)[0])
        if owner is not None and owner not in (Owner.EVERY_STAGE, Owner.STAGE0):
            raise ConfigError(f"{arg.split('=', 1)[0]} cannot follow --: flags after -- go to every stage"
                              " (skippy up sets the per-stage files and sockets; give the rest before --)")
    options = parse_serving_args(["--config", str(config), "--topology", str(topology),
                                  *FlagReader(args).argv(UP_OWNERS), *args.passthrough, "--openai-bind-addr", args.bind])
    refuse_unsupported(options)
    sidecar = options.speculative.native_mtp_draft_model_path
    refusal = sidecar_refusal(resolve_model_path(options.config.model_source), Path(sidecar)) if sidecar else ""
    if refusal:
        raise ConfigError(refusal)
    return options


def native_mtp_sidecar_flags(options: ServingOptions) -> list[str]:
    """The final stage attaches the External MTP sidecar (skippy.runtime.mtp); stage 0 only proposes its drafts."""
    spec = options.speculative
    if spec.native_mtp_draft_model_path is None:
        return []
    plan = [] if spec.plan_path is None else ["--openai-speculative-config", spec.plan_path]  # the stage checks both
    return [*plan, "--openai-native-mtp-draft-model-path", spec.native_mtp_draft_model_path]


def run(args: argparse.Namespace) -> int:
    refuse_unused_up_flags(args)
    if args.max_stage_restarts < 0:
        raise ConfigError(f"--max-stage-restarts must be >= 0, got {args.max_stage_restarts}")
    run_dir = (args.run_dir or Path("runs") / time.strftime("up-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    note = _layout_note(args)  # before args.stage_cpus changes hands below
    pipelines = _pipelines(args, run_dir)
    remote = ssh_stages(args.hosts, run_dir / "topology" / "plan.json", pipelines, run_dir,  # hosts file `ssh` entries
                        insecure_links=FlagReader(args).switch("--insecure-links") or "--insecure-links" in args.passthrough)
    first = pipelines[0]
    args.stage_cpus = first.stage_cpus  # stage 0's own view, as its command line will say
    options = stage0_options(args, first.topology, first.configs[0])
    args.stage_cpus = None  # each pipeline's share goes to its own stages
    for line in (note, getattr(args, "context_note", None)):
        if line is not None:
            print(f"skippy up: {line}", file=sys.stderr, flush=True)
    if options.insecure_links:
        print("skippy up: warning: --insecure-links: stage links are plain ZeroMQ, neither authenticated nor"
              " encrypted (`skippy keys --topology T` makes keys)", file=sys.stderr, flush=True)
    openai = options.openai
    assert openai is not None
    flags = FlagReader(args)
    key = openai.api_key or api_key_from(None)
    open_bind = open_bind_warning(args.bind, key, "--bind")
    for warning in ([COMMAND_LINE_WARNING] if flags.given("--openai-api-key") else []) + ([open_bind] if open_bind else []):
        print(f"skippy up: warning: {warning}", file=sys.stderr, flush=True)
    children = StageProcesses(first.topology, first.configs, run_dir, [*flags.argv([Owner.EVERY_STAGE]), *args.passthrough],
                              include_stage0=True, first_flags=flags.argv([Owner.STAGE0]),
                              last_flags=native_mtp_sidecar_flags(options),
                              env={API_KEY_ENV: key} if key else None,  # every /metrics and the adapter want it
                              stage_cpus=[s for p in pipelines for s in _cpu_sets(p)], replicas=pipelines[1:],
                              own_stage_cpus=first.stage_cpus, remote_prefix=remote.prefix if remote else None)

    front = FrontProcesses(children, options, first.topology, replicas=[p.topology for p in pipelines[1:]])

    def start() -> str:
        stages = sum(len(p.configs) for p in pipelines)
        what = f"{len(pipelines)} replicas ({stages} stages)" if len(pipelines) > 1 else f"{stages} stage{'s' * (stages != 1)}"
        print(f"starting {what}, broker and adapter (logs: {run_dir})", file=sys.stderr, flush=True)
        children.start()
        url = front.start()
        return (f"skippy ready: {url}/v1 (model {openai.model_id}); logs: scripts/tail-logs {run_dir}; "
                "Ctrl-C stops everything")

    policy, state = RestartPolicy(max_restarts=args.max_stage_restarts), run_dir / RESTARTS_FILE
    restarter = (StageRestarter(children, policy, state, include_stage0=True, extra=front.starters()) if remote is None
                 else HostLossRestarter(children, policy, state, front.starters(), remote, args.replan,  # a lost host
                                        insecure_links=options.insecure_links))
    if remote is not None:
        remote.prepare()  # every SSH host checked and sent its slices before anything starts
    return children.supervise("skippy up", start, restarter)
