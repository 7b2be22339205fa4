"""Link keys in a topology (all stages or none, valid Z85, distinct, clients and keys_dir only with keys),
where a process finds its secret key, and the refusal of plain links beyond loopback without
--insecure-links."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy.config import ConfigError, StageTopology, parse_serving_args, refuse_unsupported
from skippy.config.link_keys import non_loopback
from skippy.config.topology import secret_key_path

KEYS = ["rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID",
        "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"]


def keyed(topology: dict[str, Any], n: int | None = None) -> dict[str, Any]:
    stages = [{**s, "public_key": KEYS[i]} if n is None or i < n else s for i, s in enumerate(topology["stages"])]
    return {**topology, "stages": stages}


def topology_error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        StageTopology.from_dict(data, "t.json")
    return str(info.value)


def test_keyed_topology_loads_with_clients_and_keys_dir(topology_dict: dict[str, Any]) -> None:
    data = {**keyed(topology_dict), "clients": [{"name": "client", "public_key": KEYS[2]}], "keys_dir": "keys"}
    topology = StageTopology.from_dict(data)
    assert [s.public_key for s in topology.stages] == KEYS[:2]
    assert topology.clients[0].name == "client" and topology.keys_dir == "keys"
    assert StageTopology.from_dict(topology.to_dict()) == topology


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: keyed(t, 1), "stages[1].public_key"),
    (lambda t: {**keyed(t), "stages": [{**t["stages"][0], "public_key": "short"}, t["stages"][1]]}, "40 Z85"),
    (lambda t: {**t, "clients": [{"name": "client", "public_key": KEYS[2]}]}, "clients"),
    (lambda t: {**t, "keys_dir": "keys"}, "keys_dir"),
    (lambda t: {**keyed(t), "clients": [{"name": "c", "public_key": KEYS[0]}]}, "the same key as stage-0"),
    (lambda t: {**keyed(t), "clients": [{"name": "stage-1", "public_key": KEYS[2]}]}, "already a name"),
], ids=["partial", "bad-key", "clients-without-keys", "keys-dir-without-keys", "duplicate-key", "client-name"])
def test_bad_keys_are_refused(topology_dict: dict[str, Any], edit: Callable[[dict[str, Any]], dict[str, Any]],
                              message: str) -> None:
    assert message in topology_error(edit(topology_dict))


def test_secret_key_path(tmp_path: Path, topology_dict: dict[str, Any]) -> None:
    plain = StageTopology.from_dict(topology_dict)
    assert secret_key_path(plain, "stage-0") is None
    assert secret_key_path(plain, "stage-0", "/k/x.key_secret") == Path("/k/x.key_secret")
    with pytest.raises(ConfigError, match="no keys_dir"):
        secret_key_path(StageTopology.from_dict(keyed(topology_dict)), "stage-0")
    with_dir = StageTopology.from_dict({**keyed(topology_dict), "keys_dir": str(tmp_path)})
    assert secret_key_path(with_dir, "stage-1") == tmp_path / "stage-1.key_secret"


@pytest.mark.parametrize(("endpoint", "exposed"), [
    ("tcp://127.0.0.1:5000", False), ("tcp://127.8.9.10:5000", False), ("tcp://[::1]:5000", False),
    ("tcp://localhost:5000", False), ("ipc:///tmp/x.sock", False), ("inproc://x", False),
    ("tcp://10.77.0.2:5000", True), ("tcp://0.0.0.0:5000", True), ("tcp://*:5000", True), ("tcp://host.lan:5000", True),
])
def test_non_loopback(endpoint: str, exposed: bool) -> None:
    assert non_loopback(endpoint) is exposed


def _serving(tmp_path: Path, topology: dict[str, Any], *flags: str, bind: str = "tcp://127.0.0.1:0") -> Any:
    (tmp_path / "t.json").write_text(json.dumps(topology))
    stage = {"run_id": "r", "topology_id": topology["topology_id"], "model_id": topology["model_id"],
             "stage_id": "stage-1", "stage_index": 1, "layer_start": 4, "layer_end": 8, "load_mode": "runtime-slice",
             "bind_addr": bind}
    (tmp_path / "s.json").write_text(json.dumps(stage))
    options = parse_serving_args(["--config", str(tmp_path / "s.json"), "--topology", str(tmp_path / "t.json"), *flags])
    refuse_unsupported(options)
    return options


def test_plain_links_beyond_loopback_need_insecure_links(tmp_path: Path, topology_dict: dict[str, Any]) -> None:
    remote = {**topology_dict, "stages": [topology_dict["stages"][0],
                                          {**topology_dict["stages"][1], "endpoint": "tcp://10.77.0.2:5000"}]}
    with pytest.raises(ConfigError, match=r"non-loopback address tcp://10\.77\.0\.2:5000 without link keys.*"
                                          r"skippy keys --topology FILE.*--insecure-links"):
        _serving(tmp_path, remote)
    assert _serving(tmp_path, remote, "--insecure-links").insecure_links
    with pytest.raises(ConfigError, match=r"tcp://0\.0\.0\.0:5001"):  # a wildcard bind is beyond loopback too
        _serving(tmp_path, topology_dict, bind="tcp://0.0.0.0:5001")
    assert _serving(tmp_path, topology_dict).insecure_links is False  # loopback: no keys needed


def test_keyed_topology_needs_no_flag_and_finds_the_secret_beside_it(tmp_path: Path,
                                                                     topology_dict: dict[str, Any]) -> None:
    remote = keyed({**topology_dict, "stages": [topology_dict["stages"][0],
                                                {**topology_dict["stages"][1], "endpoint": "tcp://10.77.0.2:5000"}]})
    options = _serving(tmp_path, {**remote, "keys_dir": "keys"})
    assert options.link_secret_key == str(tmp_path / "keys" / "stage-1.key_secret")
    assert options.topology.keys_dir == str(tmp_path / "keys")  # absolute: copies of the topology still find it
    assert _serving(tmp_path, remote, "--link-secret-key", "/x.key_secret").link_secret_key == "/x.key_secret"
