"""File-level failures: missing files, bad JSON, non-object roots, one-line messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.config import ConfigError, SpeculativeDecodeConfig, StageConfig, StageTopology

LOADERS = [StageConfig.load, StageTopology.load, SpeculativeDecodeConfig.load]


@pytest.mark.parametrize("load", LOADERS)
def test_missing_file_names_the_path(tmp_path: Path, load) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"nope.json: config file not found") as info:
        load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("load", LOADERS)
def test_invalid_json_names_path_line_and_column(tmp_path: Path, load) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "run_id": "r",\n  "lane_count": 4x\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: invalid JSON at line 3 column 18: ")
    assert "\n" not in message


def test_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        StageConfig.load(tmp_path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"run_id": "\xff"}')
    with pytest.raises(ConfigError, match=r"latin1.json: config file is not UTF-8"):
        StageConfig.load(path)


def test_top_level_must_be_an_object(write_json) -> None:
    path = write_json("list.json", [1, 2])
    with pytest.raises(ConfigError, match=r"list.json: top-level JSON value must be an object"):
        StageConfig.load(path)


def test_duplicate_keys_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"run_id": "a", "run_id": "b"}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"dup.json: duplicate key 'run_id'"):
        StageConfig.load(path)


def test_from_dict_rejects_non_object() -> None:
    with pytest.raises(ConfigError, match="<dict>: expected a JSON object"):
        StageConfig.from_dict(["not", "a", "dict"])


def test_config_error_is_a_value_error_and_one_line() -> None:
    error = ConfigError("first\nsecond")
    assert isinstance(error, ValueError)
    assert str(error) == "first second"
