"""`skippy up --openai-cors-origins`: the adapter it starts answers browsers from the allowed origins.

A preflight from an allowed origin gets Access-Control-Allow-Origin / -Methods / -Headers; one from
another origin is answered without any Access-Control-* header (the browser then blocks the call); the
real requests from the allowed origin (whole and streamed, and their errors) carry
Access-Control-Allow-Origin. Without the flag no origin is allowed (test_openai_structured's cors check).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from up_helpers import RawResponse, SkippyServer

WEB = "http://ui.example:3000"
OTHER = "http://evil.example"


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    with start_up("up-cors", tiny_llama, "--openai-cors-origins", f"{WEB}/, https://app.example") as s:
        yield s


def preflight(server: SkippyServer, path: str, origin: str) -> RawResponse:
    return server.request("OPTIONS", path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": "content-type, authorization"})


def cors_headers(response: RawResponse) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def chat(server: SkippyServer, origin: str, **fields: Any) -> RawResponse:
    body = {"model": server.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "temperature": 0, **fields}
    return server.request("POST", "/v1/chat/completions", body, headers={"Origin": origin})


def test_preflight_from_an_allowed_origin(server: SkippyServer) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
        resp = preflight(server, path, WEB)
        assert resp.status == 204 and resp.body == b""
        assert resp.headers["access-control-allow-origin"] == WEB
        assert {m.strip() for m in resp.headers["access-control-allow-methods"].split(",")} == {"POST", "OPTIONS"}
        assert resp.headers["access-control-allow-headers"] == "content-type, authorization"
        assert int(resp.headers["access-control-max-age"]) > 0
    other = preflight(server, "/v1/models", "https://app.example")  # the second listed origin, a GET route
    assert other.headers["access-control-allow-origin"] == "https://app.example"
    assert "GET" in other.headers["access-control-allow-methods"]


def test_preflight_from_another_origin_gets_no_cors_headers(server: SkippyServer) -> None:
    for origin in (OTHER, "http://ui.example:3001", "https://ui.example:3000"):  # host, port and scheme count
        resp = preflight(server, "/v1/chat/completions", origin)
        assert resp.status == 204 and "POST" in resp.headers["allow"]
        assert cors_headers(resp) == {}


def test_requests_from_the_allowed_origin_carry_allow_origin(server: SkippyServer) -> None:
    whole = chat(server, WEB)
    assert whole.status == 200 and whole.json()["choices"][0]["message"]["role"] == "assistant"
    assert whole.headers["access-control-allow-origin"] == WEB
    streamed = chat(server, WEB, stream=True)
    assert streamed.status == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["access-control-allow-origin"] == WEB
    assert streamed.body.rstrip().endswith(b"data: [DONE]")
    refused = chat(server, WEB, n=2)  # a browser client can read the 400 too
    assert refused.status == 400 and refused.json()["error"]["param"] == "n"
    assert refused.headers["access-control-allow-origin"] == WEB
    models = server.request("GET", "/v1/models", headers={"Origin": WEB})
    assert models.headers["access-control-allow-origin"] == WEB
    assert json.loads(models.body)["data"][0]["id"] == server.model_id


def test_requests_from_another_origin_carry_no_cors_headers(server: SkippyServer) -> None:
    resp = chat(server, OTHER)
    assert resp.status == 200 and cors_headers(resp) == {}  # served (CORS is the browser's check), not readable there
