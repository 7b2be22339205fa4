"""Structured output, forced tool calls, tokenize, CORS and refused fields on a real model: `skippy up`
with Gemma 3 270M named explicitly (`skippy up`'s defaults otherwise: 2 stages split at 9, 4 lanes) and the
official client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import structured_checks as checks
from up_helpers import SkippyServer

pytestmark = pytest.mark.gemma
NESTED = {"type": "object", "required": ["city", "country", "landmarks"], "properties": {
    "city": {"type": "string", "maxLength": 24},
    "country": {"type": "object", "required": ["name", "continent"], "properties": {
        "name": {"type": "string", "maxLength": 24},
        "continent": {"enum": ["Europe", "Asia", "Africa", "America", "Oceania"]}}},
    "landmarks": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "string", "maxLength": 32}}}}


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], gemma_path: Path) -> Iterator[SkippyServer]:
    """This module's server (conftest's `client` talks to it): Gemma 3 270M."""
    with start_up("up-gemma-structured", gemma_path, "--split", "9", "--lane-count", "4") as s:
        yield s


def test_json_schema_with_enum_nested_object_and_array(server: SkippyServer, client: openai.OpenAI) -> None:
    finish, content = checks.structured(client, server.model_id, "Describe Paris as JSON.", NESTED, max_tokens=160,
                                        temperature=0)
    assert finish == "stop", content
    value = json.loads(content)
    assert value["country"]["continent"] in NESTED["properties"]["country"]["properties"]["continent"]["enum"]
    streamed = checks.streamed_text(client, server.model_id, messages=[{"role": "user", "content": "Describe Paris as JSON."}],
                                    response_format=checks.schema_format(NESTED), max_tokens=160, temperature=0)
    assert streamed == (content, "stop")


def test_json_mode(server: SkippyServer, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=server.model_id, max_tokens=120, temperature=0,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "Give a JSON object with a name and an age."}])
    content = r.choices[0].message.content or ""
    assert r.choices[0].finish_reason in ("stop", "length") and content.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_forced_tool_call(server: SkippyServer, client: openai.OpenAI, stream: bool) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    name, arguments = checks.tool_call(client, server.model_id, "What is the weather in Paris, in celsius?", choice,
                                       stream, max_tokens=80, temperature=0)
    assert name == "get_weather" and arguments["unit"] in ("celsius", "fahrenheit")
    required = checks.tool_call(client, server.model_id, "What time is it in Tokyo?", "required", stream,
                                max_tokens=80, temperature=0)
    assert required[0] in checks.PARAMS


def test_tokenize_cors_and_refusals(server: SkippyServer, client: openai.OpenAI) -> None:
    tokens = checks.tokenize_round_trip(server, "Name three colors. Ünïcödé ✓")
    assert len(tokens) > 5
    checks.cors_preflight(server)
    checks.refusals(client, server.model_id)
