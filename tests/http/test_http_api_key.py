"""The HTTP API key: with one, every route but /health and /readyz (and CORS preflights) wants
`Authorization: Bearer KEY`; a missing or wrong key is a 401 in the OpenAI error envelope (with
`WWW-Authenticate: Bearer`) and nothing reaches the broker. The key comes from --openai-api-key or
$SKIPPY_OPENAI_API_KEY."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from adapter_helpers import adapter_server
from http_helpers import assert_error, request, roundtrip

from skippy.http.auth import API_KEY_ENV, api_key_from

pytestmark = pytest.mark.anyio
KEY = "sk-test-0123456789"
CHAT = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


async def test_routes_want_the_key_but_health_and_readyz(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama"), api_key=KEY) as (server, broker):
        for path in ("/health", "/readyz"):
            assert (await roundtrip(server, request("GET", path))).status == 200
        missing = assert_error(await roundtrip(server, request("POST", "/v1/chat/completions", CHAT)), 401, "invalid_api_key")
        assert missing["message"].startswith("You didn't provide an API key") and missing["type"] == "invalid_request_error"
        for header in (f"Bearer {KEY}x", f"Basic {KEY}", KEY, "Bearer "):
            reply = await roundtrip(server, request("POST", "/v1/chat/completions", CHAT, {"Authorization": header}))
            assert_error(reply, 401, "invalid_api_key")
            assert reply.headers["www-authenticate"] == "Bearer"
        for path in ("/v1/models", "/metrics"):
            assert_error(await roundtrip(server, request("GET", path)), 401, "invalid_api_key")
        assert broker.submitted == 0  # nothing unauthenticated reached the broker
        preflight = await roundtrip(server, request("OPTIONS", "/v1/chat/completions"))
        assert preflight.status == 204
        ok = await roundtrip(server, request("POST", "/v1/chat/completions", CHAT, {"Authorization": f"bearer {KEY}"}))
        assert ok.status == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
        assert (await roundtrip(server, request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"}))).status == 200
        assert broker.submitted == 1


async def test_without_a_key_the_api_is_open(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        assert (await roundtrip(server, request("POST", "/v1/chat/completions", CHAT))).status == 200
        assert broker.submitted == 1


def test_key_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert api_key_from(None) is None
    monkeypatch.setenv(API_KEY_ENV, " from-env ")
    assert api_key_from(None) == "from-env"
    assert api_key_from("from-flag") == "from-flag"
    monkeypatch.setenv(API_KEY_ENV, "")
    assert api_key_from(None) is None
