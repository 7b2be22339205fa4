"""Fixtures for the config tests: small JSON files written into tmp_path, and serving flags
resolved against a fresh stage config (``serve``, ``serve_error``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_helpers import Serve, ServeError

from skippy.config import ConfigError, ServingOptions, parse_serving_args

WriteJson = Callable[[str, Any], Path]


@pytest.fixture
def write_json(tmp_path: Path) -> WriteJson:
    """Write ``data`` as JSON to ``tmp_path/name`` and return the path."""

    def write(name: str, data: Any) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")
        return path

    return write


def make_stage_dict(**overrides: Any) -> dict[str, Any]:
    """A minimal valid stage-0 config dict (required fields only)."""
    data: dict[str, Any] = {
        "run_id": "run-1",
        "topology_id": "topo-1",
        "model_id": "tiny-model",
        "stage_id": "stage-0",
        "stage_index": 0,
        "layer_start": 0,
        "layer_end": 4,
        "load_mode": "runtime-slice",
        "bind_addr": "tcp://127.0.0.1:0",
    }
    data.update(overrides)
    return data


def make_topology_dict(n_stages: int = 2, layers_per_stage: int = 4) -> dict[str, Any]:
    return {
        "topology_id": "topo-1",
        "model_id": "tiny-model",
        "stages": [
            {
                "stage_id": f"stage-{i}",
                "stage_index": i,
                "host": "127.0.0.1",
                "endpoint": f"tcp://127.0.0.1:{19000 + i}",
                "layer_start": i * layers_per_stage,
                "layer_end": (i + 1) * layers_per_stage,
                "load_mode": "runtime-slice",
            }
            for i in range(n_stages)
        ],
    }


@pytest.fixture
def stage_dict() -> dict[str, Any]:
    return make_stage_dict()


@pytest.fixture
def topology_dict() -> dict[str, Any]:
    return make_topology_dict()


@pytest.fixture
def make_topology() -> Callable[..., dict[str, Any]]:
    return make_topology_dict


@pytest.fixture
def serve(write_json: WriteJson, stage_dict: dict[str, Any]) -> Serve:
    """Resolve flags against a fresh copy of ``stage_dict`` (see ``Serve``)."""

    def run(*flags: str, stage: dict[str, Any] | None = None) -> ServingOptions:
        path = write_json("stage.json", {**stage_dict, **(stage or {})})
        return parse_serving_args(["--config", str(path), *flags])

    return run


@pytest.fixture
def serve_error(serve: Serve) -> ServeError:
    """The one-line ConfigError that resolving flags raises (see ``ServeError``)."""

    def run(*flags: str, stage: dict[str, Any] | None = None) -> str:
        with pytest.raises(ConfigError) as info:
            serve(*flags, stage=stage)
        message = str(info.value)
        assert "\n" not in message
        return message

    return run
