"""StageTopology: validation, lookups, and checking a StageConfig against it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skippy.config import ConfigError, StageConfig, StageTopology


def test_load_and_round_trip(write_json, make_topology) -> None:
    data = make_topology(3)
    path = write_json("topology.json", data)
    topology = StageTopology.load(path)
    keyless = {**data, "clients": [], "keys_dir": None, "stages": [{**s, "public_key": None} for s in data["stages"]]}
    assert topology.to_dict() == keyless  # every field, the link key ones at their defaults
    assert json.loads(topology.to_json()) == keyless
    assert StageTopology.from_dict(topology.to_dict()) == topology
    assert len(topology.stages) == 3 and isinstance(topology.stages, tuple)


def test_lookups(make_topology) -> None:
    topology = StageTopology.from_dict(make_topology(3))
    assert topology.first().stage_id == "stage-0"
    assert topology.final().stage_id == "stage-2"
    assert topology.entry("stage-1").layer_start == 4
    assert topology.next_of(0).stage_id == "stage-1"  # type: ignore[union-attr]
    assert topology.next_of(2) is None
    with pytest.raises(KeyError):
        topology.entry("stage-9")
    with pytest.raises(IndexError):
        topology.next_of(3)


def test_host_is_optional(make_topology) -> None:
    data = make_topology(1)
    del data["stages"][0]["host"]
    assert StageTopology.from_dict(data).stages[0].host is None


def _broken(make_topology, mutate) -> str:
    data = make_topology(3)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        StageTopology.from_dict(data, "topo.json")
    return str(info.value)


def test_empty_stages_rejected(make_topology) -> None:
    message = _broken(make_topology, lambda d: d.update(stages=[]))
    assert message == "topo.json: field 'stages' must not be empty"


def test_stage_index_order(make_topology) -> None:
    def swap(d: dict[str, Any]) -> None:
        d["stages"][1]["stage_index"] = 2

    message = _broken(make_topology, swap)
    assert message == "topo.json: field 'stages[1].stage_index' must be 1, got 2"


def test_first_stage_starts_at_zero(make_topology) -> None:
    message = _broken(make_topology, lambda d: d["stages"][0].update(layer_start=1))
    assert message == "topo.json: field 'stages[0].layer_start' must equal 0, got 1"


def test_ranges_contiguous(make_topology) -> None:
    message = _broken(make_topology, lambda d: d["stages"][2].update(layer_start=9))
    assert message == (
        "topo.json: field 'stages[2].layer_start' must equal stages[1].layer_end (8), got 9"
    )


def test_entry_range_non_empty(make_topology) -> None:
    message = _broken(make_topology, lambda d: d["stages"][1].update(layer_end=4))
    assert message == "topo.json: field 'stages[1].layer_end' must be > layer_start (4), got 4"


def test_unique_stage_ids(make_topology) -> None:
    message = _broken(make_topology, lambda d: d["stages"][2].update(stage_id="stage-0"))
    assert message == "topo.json: field 'stages[2].stage_id' duplicates stages[0] (\"stage-0\")"


def test_unknown_keys_rejected(make_topology) -> None:
    message = _broken(make_topology, lambda d: d.update(activation_codec="raw-f32-v1"))
    assert message.startswith("topo.json: field 'activation_codec' is not a known StageTopology")
    message = _broken(make_topology, lambda d: d["stages"][1].update(port=1))
    assert message.startswith("topo.json: field 'stages[1].port' is not a known StageTopologyEntry")


def test_stages_required_and_typed(make_topology) -> None:
    message = _broken(make_topology, lambda d: d.pop("stages"))
    assert message == "topo.json: field 'stages' is required"
    message = _broken(make_topology, lambda d: d.update(stages={"a": 1}))
    assert message.startswith("topo.json: field 'stages' must be a list of JSON objects")


# -- StageConfig.check_against -------------------------------------------------


def _config_for(topology: dict[str, Any], index: int, stage_dict: dict[str, Any]) -> StageConfig:
    entry = topology["stages"][index]
    fields = ("stage_id", "stage_index", "layer_start", "layer_end", "load_mode")
    return StageConfig.from_dict({**stage_dict, **{name: entry[name] for name in fields}})


def test_matching_config_passes(make_topology, stage_dict: dict[str, Any]) -> None:
    data = make_topology(2)
    topology = StageTopology.from_dict(data)
    for index in range(2):
        _config_for(data, index, stage_dict).check_against(topology, "stage.json")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            {"topology_id": "other"},
            'field \'topology_id\' is "other" but the topology has "topo-1"',
        ),
        ({"model_id": "big-model"}, "field 'model_id' is \"big-model\" but the topology has"),
        ({"stage_id": "stage-7"}, 'field \'stage_id\' "stage-7" is not in topology "topo-1"'),
        ({"stage_index": 0}, "field 'stage_index' is 0 but topology stage \"stage-1\" has 1"),
        ({"layer_start": 3}, "field 'layer_start' is 3 but topology stage \"stage-1\" has 4"),
        ({"layer_end": 9}, "field 'layer_end' is 9 but topology stage \"stage-1\" has 8"),
        (
            {"load_mode": "artifact-slice"},
            "field 'load_mode' is \"artifact-slice\""
            ' but topology stage "stage-1" has "runtime-slice"',
        ),
    ],
)
def test_mismatch_names_the_field(
    make_topology, stage_dict: dict[str, Any], override: dict, expected: str
) -> None:
    data = make_topology(2)
    topology = StageTopology.from_dict(data)
    config = _config_for(data, 1, stage_dict)
    mismatched = StageConfig.from_dict({**config.to_dict(), **override})
    with pytest.raises(ConfigError) as info:
        mismatched.check_against(topology, "configs/stage1.json")
    assert str(info.value).startswith(f"configs/stage1.json: {expected}")
