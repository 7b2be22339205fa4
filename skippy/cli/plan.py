"""`skippy plan`: choose the stages and layer ranges for a model on given hosts, print the prediction,
write the topology.

    skippy plan [--model M] --stage-cpus 0,1 [--host-mem-mb 300] [--link-delay-ms 20] [--out DIR]
    skippy plan --hosts hosts.json [--plan-concurrency 16 | --latency] [--stages K] [--out DIR]
    skippy plan --netns skippy [--stage-cpus 0,1] --out DIR      # the hosts of `scripts/netns-hosts up`

Hosts come from a hosts file (skippy.plan.hosts; an SSH host with the model there is priced by a cost table measured
on it, skippy.remote.host_costs), from `--stage-cpus` (one loopback host per CPU set),
or from a namespace host set (its addresses, link conditions and `--mem-mb`); `--host-mem-mb`, `--link-delay-ms`
and `--link-mbps` describe hosts made from flags (refused with `--hosts` / `--netns`, and the link flags with one
host: skippy.cli.unused_flags). The split maximises
tok/s at `--plan-concurrency` streams (default: the lane count), or single-stream latency with `--latency` (refused together),
or with `--plan-for prefill|mixed` a long prompt's prefill, alone or with an agent's short answer (skippy.plan.objective);
it fits every host's memory. When every host holds the whole model on cores of its own, replicas (one pipeline
per host) are weighed too and served when faster (`--no-replicas`, or `--stages K`: a split).
With `--out DIR` the topology and stage configs go to DIR (plan.json
beside them) and the `skippy up` command serving it is printed (`skippy up --hosts FILE` when hosts there are
reached over SSH: only it starts their stages there, skippy.remote). `skippy up` without `--split` plans the
same way for the hosts it is given (`add_host_arguments`, `plan_for`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from skippy.cli.unused_flags import hosts_given, refuse_unused_plan_flags
from skippy.config.errors import ConfigError
from skippy.launcher import default_kv_cache
from skippy.plan.hosts import Host, hosts_from_flags, load_hosts, netns_hosts
from skippy.plan.memory import ServingShape
from skippy.plan.objective import AGENT_PROMPT_TOKENS, AGENT_REPLY_TOKENS, DEFAULT_OBJECTIVE, OBJECTIVES, Objective
from skippy.plan.plan import LEVELS, Plan, make_plan
from skippy.plan.write import write_plan
from skippy.remote.host_costs import hosts_calibrated_there
from skippy.runtime.context_size import flag_context
from skippy.runtime.models import model_id_for, resolve_model_path

__all__ = ["add_host_arguments", "hosts_given", "hosts_memory", "plan_for", "register"]


def add_host_arguments(p: argparse.ArgumentParser) -> None:
    """The flags naming the hosts a plan is for (shared by `skippy plan` and `skippy up`)."""
    p.add_argument("--hosts", type=Path, default=None, help="hosts file (JSON): address, cpus, mem_mb, delay_ms, mbps")
    p.add_argument("--netns", default=None, metavar="PREFIX", help="the hosts of a namespace host set (scripts/netns-hosts)")
    p.add_argument("--host-mem-mb", type=float, default=None, help="with --stage-cpus: each host's memory budget (MiB)")
    p.add_argument("--link-delay-ms", type=float, default=None,
                   help="with --stage-cpus: one-way delay of each hop (default 0)")
    p.add_argument("--link-mbps", type=float, default=None, help="with --stage-cpus: each link's rate")
    p.add_argument("--plan-concurrency", type=int, default=None, metavar="C",
                   help="streams the split is chosen for (default: the lane count)")
    p.add_argument("--plan-for", choices=OBJECTIVES, default=None,
                   help="what the split is chosen for: mixed (default: an agent's request, the prefill of a"
                        " --plan-prompt-tokens prompt plus --plan-reply-tokens tokens at --plan-concurrency), decode"
                        " (the most tok/s at --plan-concurrency) or prefill (the shortest prefill of that prompt, its"
                        " chunks pipelined)")
    p.add_argument("--plan-prompt-tokens", type=int, default=None, metavar="N",
                   help=f"--plan-for prefill|mixed: the prompt's tokens (default {AGENT_PROMPT_TOKENS})")
    p.add_argument("--plan-reply-tokens", type=int, default=None, metavar="N",
                   help=f"--plan-for mixed: the answer's tokens (default {AGENT_REPLY_TOKENS})")
    p.add_argument("--recalibrate", action="store_true", help="measure the cost tables again (else cached)")
    p.add_argument("--no-replicas", dest="replicas", action="store_false",
                   help="splits only: never the whole model on each host, one pipeline per host (default: weighed"
                        " when every host holds the model on cores of its own)")


def _hosts(args: argparse.Namespace) -> list[Host]:
    stage_cpus = getattr(args, "stage_cpus", None)
    if args.hosts and args.netns:
        raise ConfigError("give --hosts or --netns, not both")
    if args.hosts:
        if stage_cpus or args.host_mem_mb is not None:
            raise ConfigError("--hosts names each host's CPUs and memory; drop --stage-cpus / --host-mem-mb")
        return load_hosts(args.hosts)
    if args.netns:
        return netns_hosts(args.netns, stage_cpus)
    return hosts_from_flags(stage_cpus, args.host_mem_mb, args.link_delay_ms or 0.0, args.link_mbps)


def hosts_memory(args: argparse.Namespace) -> int | None:
    """Bytes of the smallest host given (None: one whose memory is not said, or none given: this machine's)."""
    mems = [h.mem_mb for h in _hosts(args)] if hosts_given(args) else []
    known = [m for m in mems if m is not None]
    return int(min(known) * 2**20) if known and len(known) == len(mems) else None


def plan_for(args: argparse.Namespace, *, stages: int | None = None, latency: bool = False,
             replicate: bool = True, hosts: list[Host] | None = None) -> Plan:
    """The plan for the model, hosts (`hosts`, else those `args` name) and serving shape in `args` (replicas weighed
    unless `--no-replicas`)."""
    model = resolve_model_path(args.model)
    shape = ServingShape(args.lane_count, args.ctx_size, args.prefix_cache,
                         kv_pool_cells=getattr(args, "kv_pool_cells", 0))  # `skippy up` decided both (0: a context a lane)
    concurrency = 1 if latency else (args.plan_concurrency or args.lane_count)
    refresh = args.recalibrate and hosts is None  # a re-plan (`hosts` given) measures nothing again
    priced = hosts_calibrated_there(model, _hosts(args) if hosts is None else hosts, refresh=refresh)  # SSH hosts
    return make_plan(model, priced, shape, concurrency, stages=stages, refresh=refresh,
                     replicate=replicate and args.replicas, objective=objective_of(args))


def objective_of(args: argparse.Namespace) -> Objective:
    """`--plan-for` and its workload (skippy.plan.objective)."""
    prompt, reply = args.plan_prompt_tokens, args.plan_reply_tokens
    return Objective(args.plan_for or DEFAULT_OBJECTIVE, AGENT_PROMPT_TOKENS if prompt is None else prompt,
                     AGENT_REPLY_TOKENS if reply is None else reply)


def model_id_of(spec: str) -> str:
    """The id clients put in `model` for `--model spec` (a packaged model's own id, else the GGUF's stem)."""
    return model_id_for(spec, resolve_model_path(spec))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="choose stages and layer ranges for hosts; print the prediction, write a topology")
    p.add_argument("--model", default="default",
                   help="a packaged model or a GGUF path (default: qwen2.5-coder-0.5b, Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--stage-cpus", default=None, help="one loopback host per CPU set, e.g. 0,1 or 0-1,2+3")
    add_host_arguments(p)
    p.add_argument("--lane-count", type=int, default=16, help="concurrent sessions per stage (default 16)")
    p.add_argument("--ctx-size", type=int, default=0,
                   help="context per session (default 0: the model's trained context, bounded by memory, as skippy up)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false", help="size stages without it")
    p.add_argument("--latency", action="store_true", help="minimise single-stream latency instead")
    p.add_argument("--stages", type=int, default=None, help="exactly this many stages (a split: no replicas)")
    p.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrencies to predict (default 1,4,16)")
    p.add_argument("--out", type=Path, default=None, help="write topology.json, stage configs and plan.json here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    refuse_unused_plan_flags(args)
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--levels must be concurrencies separated by commas, got '{args.levels}'") from None
    if args.ctx_size <= 0:  # as `skippy up` decides it, for the smallest host given (a negative one refused there)
        size = flag_context(resolve_model_path(args.model), args.lane_count, args.ctx_size, 0, False, hosts_memory(args))
        args.ctx_size, args.kv_pool_cells = size.ctx_size, size.kv_pool_cells
    plan = plan_for(args, stages=args.stages, latency=args.latency, replicate=args.stages is None)
    print(plan.report(levels))
    if args.out is not None:
        written = write_plan(plan, args.out.resolve(), model_id=model_id_of(args.model),
                             extra={"kv_cache": default_kv_cache(args.lane_count) if args.prefix_cache else None})
        pinned = [p.stage_cpus for p in written.pipelines]
        pin = f" --stage-cpus {','.join(c for c in pinned if c)}" if all(pinned) else ""
        topologies = " ".join(f"--topology {p.topology}" for p in written.pipelines)
        configs = sum(len(p.configs) for p in written.pipelines)
        serve = f"skippy up {topologies}{pin}"
        if args.hosts and any(h.ssh for h in load_hosts(args.hosts)):  # only `skippy up --hosts` starts stages over SSH
            serve = f"skippy up --hosts {args.hosts} (with this command's --model and serving flags)"
        print(f"wrote {', '.join(str(p.topology) for p in written.pipelines)} ({configs} stage configs,"
              f" {written.summary.name}); serve it with: {serve}")
    return 0
