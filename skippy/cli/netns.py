"""`scripts/netns-hosts`: make, change, show and remove namespace hosts (`skippy.netns`).

    scripts/netns-hosts up N [--delay-ms D] [--jitter-ms J] [--loss-pct P] [--rate-mbit R] [--mem-mb M]
                             [--emulator auto|netem|wire|none] [--prefix skippy] [--subnet 10.77.0]
    scripts/netns-hosts set [--delay-ms D] [--jitter-ms J] [--loss-pct P] [--rate-mbit R] [--prefix P]
    scripts/netns-hosts status [--prefix P]
    scripts/netns-hosts down [--prefix P | --all]

`up` prints each host's namespace and address and which emulator carries the delay (netem, or the
userspace link emulator where the kernel has no netem) and anything skipped (loss without netem).
With `--mem-mb M` each host's processes (stages `skippy up` starts there) run in a memory cgroup of M MiB.
`down` removes everything of the set and succeeds when there is nothing to remove.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from skippy.netns.hosts import (
    EMULATORS,
    HostSet,
    LinkConditions,
    NetnsError,
    all_prefixes,
    down,
    load,
    set_conditions,
    up,
)


def _conditions(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of every host-to-host packet")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="+- uniform jitter on the delay")
    p.add_argument("--loss-pct", type=float, default=0.0, help="packet loss (netem only; skipped without it)")
    p.add_argument("--rate-mbit", type=float, default=None, help="egress rate limit of every host (tbf)")
    p.add_argument("--prefix", default="skippy", help="names: <prefix>-h<k> namespaces, <prefix>-br bridge")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="netns-hosts", description="hosts you can make on one machine")
    sub = top.add_subparsers(dest="action", required=True)
    u = sub.add_parser("up", help="make N namespace hosts joined by a bridge")
    u.add_argument("count", type=int)
    _conditions(u)
    u.add_argument("--subnet", default="10.77.0", help="hosts get <subnet>.1..N, this namespace <subnet>.254")
    u.add_argument("--mem-mb", type=float, default=None,
                   help="each host's memory budget in MiB: its processes run in a memory cgroup of that limit")
    u.add_argument("--emulator", choices=EMULATORS, default="auto",
                   help="what delays: netem, the userspace wire, none (auto: netem if the kernel has it)")
    _conditions(sub.add_parser("set", help="change the conditions of a running set"))
    s = sub.add_parser("status", help="show a set")
    s.add_argument("--prefix", default="skippy")
    d = sub.add_parser("down", help="remove a set (idempotent)")
    d.add_argument("--prefix", default="skippy")
    d.add_argument("--all", action="store_true", help="every recorded set")
    return top


def describe(hosts: HostSet) -> str:
    lines = [f"host set {hosts.prefix}: {hosts.count} hosts on {hosts.subnet}.0/24 (this namespace: {hosts.gateway}),"
             f" emulator {hosts.emulator}", f"  links: {hosts.conditions.describe()}"]
    lines += [f"  {ns:<14} {address}" for ns, address in hosts.hosts]
    lines += [f"  note: {note}" for note in hosts.notes]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.action in ("up", "set"):
            conditions = LinkConditions(args.delay_ms, args.jitter_ms, args.loss_pct, args.rate_mbit)
            if args.action == "up":
                hosts = up(args.count, conditions, prefix=args.prefix, subnet=args.subnet, emulator=args.emulator,
                           mem_mb=args.mem_mb)
            else:
                hosts = set_conditions(conditions, args.prefix)
            print(describe(hosts))
        elif args.action == "status":
            found = load(args.prefix)
            print(describe(found) if found else f"host set {args.prefix} is not up")
        else:
            for prefix in all_prefixes() if args.all else [args.prefix]:
                removed = down(prefix)
                print(f"host set {prefix}: removed {', '.join(removed)}" if removed else f"host set {prefix}: nothing to remove")
    except NetnsError as exc:
        print(f"netns-hosts {args.action}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
