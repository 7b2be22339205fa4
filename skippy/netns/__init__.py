"""Hosts you can make on one machine: network namespaces joined by a bridge, with link conditions.

`scripts/netns-hosts up N` (`skippy.cli.netns`) makes namespaces ``<prefix>-h1..hN`` with addresses
``<subnet>.1..N`` (default 10.77.0.x/24) on veth pairs into a bridge ``<prefix>-br`` in the root
namespace, which itself has ``<subnet>.254``, so processes there (the broker, a benchmark's client)
reach every host. Link conditions apply to what each host sends to the others:

- rate (``--rate-mbit``): a ``tbf`` qdisc on each host's egress;
- delay, jitter, loss: ``netem`` on each host's egress where the kernel has it (emulator ``netem``);
  where it does not, host-to-host traffic is routed through a tun device ``wire0`` in every host to
  a userspace link emulator (`wire.py`, emulator ``wire``) that holds each packet for
  delay +- jitter, per direction, in order. Loss needs netem and is skipped (with the reason
  printed) under the wire;
- memory (``--mem-mb``): a memory cgroup per host (`cgroups.py`), which the stages started there join.

`sshd.py` runs Debian's OpenSSH server in each host, with keys made for the occasion, and cuts a host off as a
machine that goes away (the SSH tests and `skippy bench hosts`).
`hosts.py` creates and removes them and changes conditions live (`commands.py` runs ip / tc and probes
what the machine can do); `owner.py` finds the namespace that owns
an address, which is how `skippy up --topology T` starts each stage inside its host
(`ip netns exec`, inside the host's memory cgroup if it has one); `topology.py` puts a topology's stages
on the hosts, one per host.
Everything needs root; `unavailable_reason` says why not when it cannot work.
"""

from skippy.netns.commands import NetnsError, netem_available, unavailable_reason
from skippy.netns.hosts import HostSet, LinkConditions, down, load, set_conditions, up
from skippy.netns.owner import namespace_of, stage_command_prefix

__all__ = [
    "HostSet", "LinkConditions", "NetnsError", "down", "load", "namespace_of", "netem_available", "set_conditions",
    "stage_command_prefix", "unavailable_reason", "up",
]
