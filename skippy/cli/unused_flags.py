"""The flags of `skippy up` and `skippy plan` that a combination would leave without effect: refused, one line
naming the flag and why, before anything starts.

`skippy up` serves one of four layouts, and each reads only some of its flags:
- `--topology T`: its stage configs fix the model, split, lanes, context, prefix cache and where each stage runs;
  nothing is planned (`--stage-cpus` still pins its stages);
- `--split S`: the model split at S on this machine; nothing is planned (`--stage-cpus` pins);
- hosts (`--stage-cpus`, `--hosts`, `--netns`) and no `--split`: the plan for those hosts;
- none of these: one host, the model whole; nothing is planned.
The plan flags (`PLAN_FLAGS`) act only on a plan. Of them, `--host-mem-mb`, `--link-delay-ms` and `--link-mbps`
describe hosts made from `--stage-cpus` (or the one host of plain `skippy plan`): a hosts file and a namespace
host set give their own memory and links, and one host has no link. `skippy plan --latency` plans for one stream,
so `--plan-concurrency` has no effect there. `--plan-prompt-tokens` is read only by `--plan-for prefill|mixed`,
`--plan-reply-tokens` only by `--plan-for mixed` (the default).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from skippy.config.errors import ConfigError
from skippy.plan.objective import DEFAULT_OBJECTIVE

__all__ = ["StoreGiven", "hosts_given", "refuse_unused_plan_flags", "refuse_unused_up_flags"]

PLAN_FLAGS = ("--host-mem-mb", "--link-delay-ms", "--link-mbps", "--plan-concurrency", "--recalibrate", "--no-replicas",
              "--plan-for", "--plan-prompt-tokens", "--plan-reply-tokens")
HOST_SHAPE_FLAGS = PLAN_FLAGS[:3]  # what hosts made from --stage-cpus are like
LINK_FLAGS = PLAN_FLAGS[1:3]
# what a topology's stage configs fix, for each flag that would set it otherwise
TOPOLOGY_FIXES = {"--model": "the model", "--split": "the split", "--lane-count": "the lanes",
                  "--ctx-size": "the context", "--kv-pool-cells": "the KV pool",
                  "--no-prefix-cache": "the prefix cache, kv_cache",
                  "--hosts": "where each stage runs", "--netns": "where each stage runs"}
SWITCHES = {"--no-prefix-cache": ("prefix_cache", False), "--recalibrate": ("recalibrate", True),
            "--no-replicas": ("replicas", False)}  # flag -> (dest, its value when given)
GIVEN = "given_flags"  # the Namespace attribute naming the StoreGiven flags given
RECORDED = ("--model", "--lane-count", "--ctx-size", "--kv-pool-cells")  # `skippy up`'s flags with a value as default: StoreGiven


class StoreGiven(argparse.Action):
    """`store`, noting the flag as given: a flag whose default is a value tells no other way whether it was."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.option_strings[0]})


def given(args: argparse.Namespace, flag: str) -> bool:
    """Whether `flag` was on the command line (a switch: its dest holds its given value)."""
    if flag in SWITCHES:
        dest, value = SWITCHES[flag]
        return bool(getattr(args, dest, not value) == value)
    if flag in RECORDED:
        return flag in getattr(args, GIVEN, ())
    return getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None  # the rest default to None


def hosts_given(args: argparse.Namespace) -> bool:
    return bool(args.hosts or args.netns or getattr(args, "stage_cpus", None))


def _refuse(args: argparse.Namespace, flags: Sequence[str], why: str) -> None:
    flag = next((f for f in flags if given(args, f)), None)
    if flag is not None:
        raise ConfigError(f"{flag} has no effect {why}")


def _refuse_unused_host_flags(args: argparse.Namespace) -> None:
    """The host flags a plan for these hosts would not read."""
    if args.hosts or args.netns:
        source = "--hosts" if args.hosts else "--netns"
        what = "the hosts file" if args.hosts else "the namespace host set"
        _refuse(args, HOST_SHAPE_FLAGS, f"with {source} ({what} gives each host's memory and links); drop one")
    stage_cpus = getattr(args, "stage_cpus", None)
    if not args.hosts and not args.netns and len(stage_cpus.split(",") if stage_cpus else []) < 2:
        _refuse(args, LINK_FLAGS, "with one host: one stage has no link (--stage-cpus with two CPU sets or more"
                                  " makes a host of each)")


def refuse_unused_up_flags(args: argparse.Namespace) -> None:
    """`skippy up`: refuse each flag that the layout asked for (module docstring) does not read."""
    if args.topology:
        for flag, what in TOPOLOGY_FIXES.items():
            _refuse(args, [flag], f"with --topology (its stage configs fix {what}); drop one")
        _refuse(args, PLAN_FLAGS, "with --topology (nothing is planned: the topology is served as it is); drop one")
    elif args.split is not None:
        _refuse(args, ["--hosts", "--netns"], "with --split (it names the hosts to plan a split for; --split splits"
                                              " on this machine); drop one")
        _refuse(args, PLAN_FLAGS, "with --split (nothing is planned: --split fixes the layout); drop one")
    elif not hosts_given(args):
        _refuse(args, PLAN_FLAGS, "without hosts to plan for (--stage-cpus, --hosts or --netns): one host serves"
                                  " the model whole, nothing is planned")
    else:
        _refuse_unused_host_flags(args)
        _refuse_unused_workload_flags(args)


def _refuse_unused_workload_flags(args: argparse.Namespace) -> None:
    """The workload flags the objective (`--plan-for`) would not read."""
    objective = getattr(args, "plan_for", None) or DEFAULT_OBJECTIVE
    if objective == "decode":
        _refuse(args, ["--plan-prompt-tokens"], "with --plan-for decode (decode rounds have no prompt)")
    if objective != "mixed":
        _refuse(args, ["--plan-reply-tokens"], f"with --plan-for {objective} (only mixed counts an answer)")


def refuse_unused_plan_flags(args: argparse.Namespace) -> None:
    """`skippy plan`: the host flags its hosts would not read, `--plan-concurrency` with `--latency`, and the
    workload flags `--plan-for` would not read."""
    _refuse_unused_host_flags(args)
    _refuse_unused_workload_flags(args)
    if args.latency:
        _refuse(args, ["--plan-concurrency"], "with --latency (a latency plan is for one stream); drop one")
        if args.plan_for == "prefill":
            raise ConfigError("--latency has no effect with --plan-for prefill (a prompt's prefill has no stream"
                              " count); drop one")
