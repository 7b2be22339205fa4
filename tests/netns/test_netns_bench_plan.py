"""`skippy bench plan --netns PREFIX`: the prediction is for the namespace set's hosts and links, and `skippy up`
is told to serve the same split on them (one stage per host, the set's CPU pairing, plain TCP links).

The loopback form keeps its own: each forward hop delayed by `--downstream-wire-delay-ms`, the return undelayed.
"""

from __future__ import annotations

import argparse

import pytest
from netns_helpers import MakeHosts

from skippy.bench.plan import add_to, hosts_and_flags
from skippy.config.errors import ConfigError
from skippy.netns import LinkConditions


def bench_args(*flags: str) -> argparse.Namespace:
    """`skippy bench plan FLAGS` as its own parser reads them."""
    parser = argparse.ArgumentParser()
    add_to(parser.add_subparsers())
    return parser.parse_args(["plan", "--stage-cpus", "0,1,0", *flags])


def test_bench_plan_netns_plans_for_the_sets_hosts_and_serves_on_them(netns_hosts: MakeHosts) -> None:
    hosts = netns_hosts(3, LinkConditions(rate_mbit=500.0))
    planned, flags = hosts_and_flags(bench_args("--netns", hosts.prefix), 4)
    assert [(h.name, h.address, h.cpus) for h in planned] == [(ns, a, c) for (ns, a), c in zip(hosts.hosts, "010")]
    assert all(h.mbps == 500.0 and h.delay_ms == 0.0 for h in planned)  # every hop's link, the return included
    assert flags == ["--stage-cpus", "0,1,0", "--plan-concurrency", "4", "--netns", hosts.prefix, "--insecure-links"]
    with pytest.raises(ConfigError, match="drop --delay-ms"):
        hosts_and_flags(bench_args("--netns", hosts.prefix, "--delay-ms", "20"), 4)
    with pytest.raises(ConfigError, match="3 hosts"):
        hosts_and_flags(bench_args("--netns", hosts.prefix, "--stage-cpus", "0,1"), 4)


def test_bench_plan_on_loopback_delays_forward_hops_only() -> None:
    planned, flags = hosts_and_flags(bench_args("--stage-cpus", "0,1", "--delay-ms", "20"), 16)
    assert [h.delay_ms for h in planned] == [20.0, 0.0]
    assert flags == ["--stage-cpus", "0,1", "--plan-concurrency", "16", "--downstream-wire-delay-ms", "20.0"]
    _, plain = hosts_and_flags(bench_args("--stage-cpus", "0,1", "--plain"), 16)
    assert "--no-speculative" in plain  # plain decoding: what the cost model predicts
    _, split = hosts_and_flags(bench_args("--stage-cpus", "0,1", "--no-replicas"), 16)
    assert "--no-replicas" in split and "--no-replicas" not in flags  # skippy up asked for a split
