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

import dataclasses
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skippy.config.errors import ConfigError
from skippy.config.schema import ConfigModel, check

if TYPE_CHECKING:
    from skippy.config.stage import StageTopology

__all__ = ["CLIENT_NAME", "LinkClient", "check_public_key", "check_topology_keys", "insecure_problem",
           "non_loopback", "secret_key_path", "with_keys_dir"]

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


def check_topology_keys(topology: StageTopology) -> None:
    """All stages keyed or none; clients and keys_dir only with keys; every key distinct."""
    keyed = [s.public_key is not None for s in topology.stages]
    if any(keyed) and not all(keyed):
        missing = keyed.index(False)
        check(False, f"stages[{missing}].public_key",
              "is missing: once one stage has a public key every stage needs one (`skippy keys --topology FILE`)")
    if not any(keyed):
        check(not topology.clients, "clients", "need the stages' public keys too")
        check(topology.keys_dir is None, "keys_dir", "needs the stages' public keys too")
        return
    check(topology.keys_dir is None or topology.keys_dir.strip() != "", "keys_dir", "must not be empty")
    names = [s.stage_id for s in topology.stages]
    keys = [s.public_key for s in topology.stages]
    for i, client in enumerate(topology.clients):
        check(client.name not in names, f"clients[{i}].name", f"{client.name!r} is already a name in this topology")
        names.append(client.name)
        keys.append(client.public_key)
    for i, key in enumerate(keys):
        check(keys.index(key) == i, "public_key", f"{names[i]} has the same key as {names[keys.index(key)]}")


def with_keys_dir(topology: StageTopology, path: str | Path) -> StageTopology:
    """`topology` (loaded from `path`) with its keys_dir made absolute, so copies of it still find the keys."""
    if topology.keys_dir is None:
        return topology
    return dataclasses.replace(topology, keys_dir=str((Path(path).parent / topology.keys_dir).resolve()))


def secret_key_path(topology: StageTopology | None, name: str, override: str | None = None) -> Path | None:
    """This process's secret key file: `override`, else `<keys_dir>/<name>.key_secret` of a keyed topology."""
    if override is not None:
        return Path(override)
    if topology is None or topology.first().public_key is None:
        return None
    if topology.keys_dir is None:
        raise ConfigError(f"topology {topology.topology_id!r} names public keys but no keys_dir: "
                          "pass --link-secret-key or add keys_dir")
    return Path(topology.keys_dir) / f"{name}.key_secret"


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


def insecure_problem(topology: StageTopology | None, bind_addr: str, insecure_links: bool) -> str | None:
    """Why this process must not start: plain links beyond loopback without `--insecure-links`."""
    if insecure_links or (topology is not None and topology.first().public_key is not None):
        return None
    endpoints = [s.endpoint for s in topology.stages] if topology is not None else []
    exposed = [e for e in [bind_addr, *endpoints] if non_loopback(e)]
    if not exposed:
        return None
    where = f"topology {topology.topology_id!r}" if topology is not None else "this stage"
    return (f"{where} uses non-loopback address {exposed[0]} without link keys: run `skippy keys --topology FILE`"
            " to authenticate and encrypt the stage links, or pass --insecure-links to run them in the clear")
