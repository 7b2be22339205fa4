"""`skippy keys`: CURVE key pairs for authenticated stage links.

    skippy keys --dir DIR NAME [NAME ...]           a pair per name; prints `NAME PUBLIC_KEY`
    skippy keys --topology T [--dir DIR] [--client NAME ...]

The second form makes a pair for every stage of T and for each client (default one, `client`: the
broker and tools use it), in DIR (default: `keys` beside T), and writes into T each stage's
`public_key`, the `clients` and `keys_dir`. Existing pairs are kept (`--force` makes new ones). Each
pair is `<name>.key` (public) and `<name>.key_secret` (mode 0600): give each machine the topology and
only the secret keys of the processes it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from skippy.config import ConfigError
from skippy.config.link_keys import CLIENT_NAME
from skippy.transport.curve_keys import add_link_keys, write_key_pair


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="write CURVE key pairs for authenticated stage links")
    p.add_argument("names", nargs="*", metavar="NAME", help="a key pair per name (with --dir)")
    p.add_argument("--dir", type=Path, default=None, help="where the pairs go (with --topology: default keys/ beside it)")
    p.add_argument("--topology", type=Path, default=None, help="make pairs for its stages and clients; write the keys in")
    p.add_argument("--client", action="append", default=None, metavar="NAME",
                   help=f"with --topology: a client key pair (repeatable; default one named {CLIENT_NAME!r})")
    p.add_argument("--force", action="store_true", help="replace existing pairs")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.topology is None:
        if args.dir is None or not args.names:
            raise ConfigError("give --dir DIR and names, or --topology T")
        for name in args.names:
            print(name, write_key_pair(args.dir, name, force=args.force))
        return 0
    if args.names:
        raise ConfigError("with --topology the names are its stages (and --client NAME)")
    return keys_for_topology(args.topology, args.dir or args.topology.parent / "keys", args.client or [CLIENT_NAME],
                             force=args.force)


def keys_for_topology(path: Path, directory: Path, clients: list[str], *, force: bool = False) -> int:
    """Pairs for every stage and client of the topology at `path`, their public keys written into it."""
    for name, public in add_link_keys(path, directory, clients, force=force):
        print(name, public)
    print(f"wrote the public keys into {path}; secret keys in {directory} (each machine needs only its own)")
    return 0
