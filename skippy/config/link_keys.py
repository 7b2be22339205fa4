"""Link keys in a topology: which CURVE public key each stage and client has, and where secrets live.

A topology either names no keys (links are plain ZeroMQ) or names one for every stage (each entry's
`public_key`), plus `clients`: the processes that are not stages but talk to them (the broker,
`skippy generate --topology`, scripts/wire-delay), each with a name and a public key. `keys_dir`
(relative to the topology file) is where this machine keeps its secret keys, `<name>.key_secret` as
`skippy keys` writes them: a stage reads `<stage_id>.key_secret`, a client `client.key_secret`
(`--link-secret-key` names another file). Keys are Z85 text, 40 characters (32 bytes).

A topology whose stages bind or are reached at a non-loopback address must have keys, unless the
process is told `--insecure-links` (`insecure_problem`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from skippy.config.schema import ConfigModel, check

__all__ = ["CLIENT_NAME", "LinkClient", "check_public_key", "non_loopback"]

CLIENT_NAME = "client"  # the default client key pair's name (broker, generate, wire-delay)
_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def check_public_key(value: str | None, field: str) -> None:
    """A CURVE public key in Z85 text (40 characters), or None."""
    check(value is None or (len(value) == 40 and set(value) <= _Z85), field,
          f"must be a CURVE public key (40 Z85 characters, as `skippy keys` prints), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LinkClient(ConfigModel):
    """A process that is not a stage but connects to stages (broker, tools), by its public key."""

    name: str
    public_key: str

    def _check(self) -> None:
        check(self.name.strip() != "" and "/" not in self.name, "name", f"must be a plain name, got {self.name!r}")
        check_public_key(self.public_key, "public_key")


def non_loopback(endpoint: str) -> bool:
    """Whether a tcp endpoint binds or dials beyond this machine (ipc:// and inproc:// never do)."""
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name or a wildcard (*, an interface): not known to stay on this machine
