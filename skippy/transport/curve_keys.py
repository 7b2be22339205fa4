"""Key files and the `LinkKeys` of a process, from its topology.

`skippy keys` writes a key pair as ZeroMQ's certificate files: `<name>.key` (public) and
`<name>.key_secret` (both keys; mode 0600). A stage's `LinkKeys` come from its topology: its own pair
(its secret key file, whose public key must be the one the topology names for it), every stage's
endpoint with that stage's public key (stage 0's request endpoint too, and a wildcard bind as a peer
dials it), and every stage and client key as the peers it admits. A client (broker, tools) loads a
pair the topology lists under `clients`; its keys name the servers of every topology it talks to.
`add_link_keys` gives every stage and client of a topology a pair and writes the public keys into it
(`skippy keys --topology`; `skippy up` for stages it starts over SSH).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import zmq
import zmq.auth

from skippy.config import ConfigError, ServingOptions, StageTopology
from skippy.config.schema import load_json_object
from skippy.config.topology import secret_key_path
from skippy.transport.curve_guard import LinkKeys
from skippy.transport.endpoints import request_endpoint

__all__ = ["add_link_keys", "client_link_keys", "link_keys", "load_key_pair", "stage_link_keys", "write_key_pair"]


def write_key_pair(directory: Path, name: str, *, force: bool = False) -> str:
    """Write `<name>.key` and `<name>.key_secret` in `directory` (kept when both exist, unless `force`);
    returns the public key (Z85 text)."""
    directory.mkdir(parents=True, exist_ok=True)
    secret = directory / f"{name}.key_secret"
    if secret.exists() and (directory / f"{name}.key").exists() and not force:
        return load_key_pair(secret)[0].decode()
    public_file, secret_file = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret_file, 0o600)
    return zmq.auth.load_certificate(public_file)[0].decode()


def add_link_keys(path: Path, directory: Path, clients: Sequence[str], *, force: bool = False) -> list[tuple[str, str]]:
    """A pair in `directory` for every stage and client of the topology at `path` (kept when there, unless `force`),
    their public keys, `clients` and `keys_dir` written into it; returns (name, public key) of each."""
    data = load_json_object(path)
    StageTopology.from_dict(data, str(path))  # a valid topology before anything is written
    made = []
    for stage in data["stages"]:
        stage["public_key"] = write_key_pair(directory, stage["stage_id"], force=force)
        made.append((stage["stage_id"], stage["public_key"]))
    data["clients"] = [{"name": name, "public_key": write_key_pair(directory, name, force=force)} for name in clients]
    made += [(client["name"], client["public_key"]) for client in data["clients"]]
    data["keys_dir"] = os.path.relpath(directory.resolve(), path.resolve().parent)
    StageTopology.from_dict(data, str(path))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return made


def load_key_pair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a `.key_secret` file; ConfigError naming the file otherwise."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the secret key file {path}: {exc}") from None
    if secret is None:
        raise ConfigError(f"{path} holds no secret key (use the .key_secret file `skippy keys` wrote)")
    return public, secret


def _servers(topology: StageTopology) -> dict[str, bytes]:
    servers: dict[str, bytes] = {}
    for i, stage in enumerate(topology.stages):
        assert stage.public_key is not None
        key = stage.public_key.encode()
        endpoints = [stage.endpoint, *([request_endpoint(stage.endpoint)] if i == 0 else [])]
        for endpoint in endpoints:
            servers[endpoint] = key
            host, _, port = endpoint.rpartition(":")
            if host.startswith("tcp://"):  # a stage bound on a wildcard announces its loopback form
                servers.setdefault(f"tcp://127.0.0.1:{port}", key)
    return servers


def _peers(topology: StageTopology) -> dict[bytes, str]:
    named = [(s.stage_id, s.public_key) for s in topology.stages] + [(c.name, c.public_key) for c in topology.clients]
    return {key.encode(): name for name, key in named if key is not None}


def link_keys(topology: StageTopology, name: str, secret_file: Path) -> LinkKeys:
    """The keys of process `name` (a stage or a client of `topology`) with its pair from `secret_file`."""
    public, secret = load_key_pair(secret_file)
    peers = _peers(topology)
    if peers.get(public) != name:
        raise ConfigError(f"the key pair in {secret_file} is not {name!r}'s in topology {topology.topology_id!r}"
                          f" (its public key {public.decode()} is {peers.get(public) or 'not in the topology'})")
    return LinkKeys(name, public, secret, _servers(topology), peers)


def stage_link_keys(options: ServingOptions) -> LinkKeys | None:
    """A stage's keys (None: its topology names no keys)."""
    if options.link_secret_key is None:
        return None
    if options.topology is None:
        raise ConfigError("--link-secret-key needs --topology (the public keys of the peers are there)")
    return link_keys(options.topology, options.config.stage_id, Path(options.link_secret_key))


def client_link_keys(topologies: Sequence[StageTopology], secret_file: str | None = None) -> LinkKeys | None:
    """A client's keys toward the stages of `topologies` (None: none of them names keys). Its pair is
    `secret_file`, else `<keys_dir>/client.key_secret` of the first keyed topology; every keyed topology
    must list that pair's public key among its clients."""
    keyed = [t for t in topologies if t.first().public_key is not None]
    if not keyed:
        return None
    path = secret_key_path(keyed[0], "client", secret_file)
    assert path is not None
    public, secret = load_key_pair(path)
    servers: dict[str, bytes] = {}
    name = "client"
    for topology in keyed:
        clients = {c.public_key.encode(): c.name for c in topology.clients}
        if public not in clients:
            raise ConfigError(f"the key pair in {path} is not a client of topology {topology.topology_id!r}"
                              " (add its public key to the topology's clients)")
        name = clients[public]
        servers.update(_servers(topology))
    return LinkKeys(name, public, secret, servers, {})
