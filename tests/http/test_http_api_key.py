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
from http_helpers import Reply, assert_error, request, roundtrip

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
        for path, body in (("/v1/messages", MESSAGES), ("/v1/chat/completions", CHAT)):  # Anthropic's header, any route
            assert (await roundtrip(server, request("POST", path, body, {"x-api-key": KEY}))).status == 200
        assert broker.submitted == 3


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


OPEN = {"/health", "/readyz"}
MESSAGES = json.dumps({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
BODIES = {"/v1/chat/completions": CHAT, "/v1/completions": json.dumps({"model": "tiny", "prompt": "hi"}).encode(),
          "/tokenize": b'{"prompt": "hi"}', "/detokenize": b'{"tokens": [72]}',
          "/v1/responses": json.dumps({"model": "tiny", "input": "hi"}).encode(), "/v1/messages": MESSAGES,
          "/v1/messages/count_tokens": MESSAGES}
ANTHROPIC = {"/v1/messages", "/v1/messages/count_tokens"}  # errors in Anthropic's envelope


def assert_unauthorized(reply: Reply, path: str) -> None:
    """A 401 in the route's envelope: OpenAI's (`invalid_api_key`), or Anthropic's on the Messages routes."""
    if path not in ANTHROPIC:
        assert_error(reply, 401, "invalid_api_key")
        return
    assert reply.status == 401 and reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert reply.json() == {"type": "error", "error": {"type": "authentication_error", "message": error["message"]}}


async def test_every_route_of_the_adapter_wants_the_key(tiny_model: Callable[..., Path]) -> None:
    """The adapter's own route table (OpenAIAdapter.router, what `skippy adapter` serves): every route but the
    probes and the preflights is a 401 without the key, with a wrong Bearer key, a wrong `?key=` and a wrong
    dashboard cookie, so a route added later cannot slip out from behind the key."""
    async with adapter_server(tiny_model("llama"), api_key=KEY) as (server, broker):
        routes = server.router.routes()
        assert {("GET", "/dashboard"), ("GET", "/dashboard/data"), ("GET", "/metrics"), ("POST", "/v1/responses"),
                ("POST", "/v1/responses/input_tokens"), ("POST", "/v1/messages"),
                ("POST", "/v1/messages/count_tokens")} <= set(routes)
        guarded = [(m, p) for m, p in routes if m not in ("OPTIONS", "HEAD") and p not in OPEN]
        assert len(guarded) >= 14, routes
        for method, path in guarded:
            body = BODIES.get(path, b"")
            for headers, query in (({}, ""), ({"Authorization": f"Bearer {KEY}-wrong"}, ""), ({}, f"?key={KEY}-wrong"),
                                   ({"Cookie": "skippy_dashboard=0123abcd"}, ""), ({"Authorization": f"Bearer {KEY[:-1]}"}, "")):
                for wrong in ({}, {"x-api-key": f"{KEY}-wrong"}):
                    reply = await roundtrip(server, request(method, path + query, body, {**headers, **wrong}))
                    assert_unauthorized(reply, path)
                    assert "set-cookie" not in reply.headers, (method, path)
        assert [(m, p) for m, p in routes if m == "HEAD"] == [("HEAD", "/")]  # as GET / (checked above), no body
        assert (await roundtrip(server, request("HEAD", "/"))).status == 401
        for method, path in routes:
            if path in OPEN and method == "GET":
                assert (await roundtrip(server, request(method, path))).status == 200
            elif method == "OPTIONS":
                assert (await roundtrip(server, request(method, path))).status == 204
        assert broker.submitted == 0


async def test_the_dashboard_takes_the_key_once_as_a_query_then_its_cookie(tiny_model: Callable[..., Path]) -> None:
    """A browser cannot send a Bearer header with a page it opens: `/dashboard?key=KEY` answers a 303 to the
    same URL without the key, setting an HttpOnly SameSite=Strict cookie (not the key) that opens the
    dashboard's routes, and only those."""
    async with adapter_server(tiny_model("llama"), api_key=KEY) as (server, broker):
        first = await roundtrip(server, request("GET", f"/dashboard?interval=200&key={KEY}"))
        assert first.status == 303 and first.headers["location"] == "/dashboard?interval=200"
        cookie, *attributes = [part.strip() for part in first.headers["set-cookie"].split(";")]
        assert cookie.startswith("skippy_dashboard=") and KEY not in cookie
        assert set(attributes) == {"Path=/dashboard", "HttpOnly", "SameSite=Strict"}
        with_cookie = {"Cookie": f"other=1; {cookie}"}
        page = await roundtrip(server, request("GET", "/dashboard?interval=200", headers=with_cookie))
        assert page.status == 200 and page.headers["content-type"].startswith("text/html")
        for path in ("/dashboard/dashboard.js", "/dashboard/dashboard.css"):
            assert (await roundtrip(server, request("GET", path, headers=with_cookie))).status == 200
        data = await roundtrip(server, request("GET", "/dashboard/data", headers=with_cookie))
        assert data.status == 200 and data.json()["processes"][0]["process"] == "adapter"
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/v1/models"),
                             ("POST", "/tokenize")):  # the cookie opens the dashboard only
            reply = await roundtrip(server, request(method, path, BODIES.get(path, b""), with_cookie))
            assert_error(reply, 401, "invalid_api_key")
        bearer = await roundtrip(server, request("GET", "/dashboard/data", headers={"Authorization": f"Bearer {KEY}"}))
        assert bearer.status == 200 and bearer.headers["set-cookie"].split(";")[0] == cookie
        assert broker.submitted == 0
