"""`--deterministic` (and a config's `deterministic: true`): set on the stage config, and what cannot be
deterministic refused in one line naming the field and the flag."""

from __future__ import annotations

from typing import Any

import pytest
from config_helpers import Serve, ServeError

from skippy.config import ConfigError, StageConfig
from skippy.config.serving import unsupported_options
from tests.config.conftest import WriteJson, make_stage_dict


def test_the_flag_sets_the_config_field(serve: Serve) -> None:
    assert serve().config.deterministic is False
    assert serve("--deterministic").config.deterministic is True


@pytest.mark.parametrize(("overrides", "says"), [
    ({"flash_attn_type": "disabled"}, "field 'flash_attn_type' 'disabled' cannot be deterministic"),
    ({"n_gpu_layers": -1}, "field 'n_gpu_layers' deterministic mode is for the CPU backend only"),
    ({"n_ubatch": 64, "n_batch": 64}, "field 'n_ubatch' must be <= 63 with deterministic"),
    ({"kv_pool_cells": 4096}, "field 'kv_pool_cells' not with deterministic: every lane has a context of its own"),
])
def test_what_cannot_be_deterministic_is_refused(serve: Serve, serve_error: ServeError, overrides: dict[str, Any],
                                                 says: str) -> None:
    assert serve(stage=overrides).config.deterministic is False  # the same config serves without the flag
    message = serve_error("--deterministic", stage=overrides)
    assert message.startswith("--deterministic cannot be served with ") and says in message, message


def test_a_config_file_with_deterministic_is_checked_too() -> None:
    with pytest.raises(ConfigError, match="field 'flash_attn_type' 'disabled' cannot be deterministic"):
        StageConfig.from_dict(make_stage_dict(deterministic=True, flash_attn_type="disabled"))


def test_native_mtp_drafts_with_deterministic_are_refused_in_one_line(serve: Serve, write_json: WriteJson) -> None:
    plan = str(write_json("mtp.json", {"native_mtp": {"enabled": True, "max_draft_tokens": 2}}))
    assert unsupported_options(serve("--openai-speculative-config", plan)) == []  # either alone serves
    assert unsupported_options(serve("--deterministic")) == []
    lines = unsupported_options(serve("--deterministic", "--openai-speculative-config", plan))
    assert len(lines) == 1 and lines[0].startswith(f"--deterministic and the native MTP drafts of {plan} cannot be")
