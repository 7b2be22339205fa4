"""CORS on a real HttpServer: preflights answered on every route, Access-Control-* only for allowed origins,
on successes and errors alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from http_helpers import WAIT, Reply, request, roundtrip

from skippy.cli.adapter import cors_origins
from skippy.http.cors import CorsPolicy
from skippy.http.errors import HttpError
from skippy.http.server import HttpServer, Request, Response, Router, json_response

pytestmark = pytest.mark.anyio
WEB = "http://ui.example:3000"


@asynccontextmanager
async def cors_server(origins: str) -> AsyncIterator[HttpServer]:
    cors = CorsPolicy(cors_origins(origins))

    async def ok(_: Request) -> Response:
        return json_response({"ok": True})

    async def refuse(_: Request) -> Response:
        raise HttpError(400, "temperature: bad", param="temperature")

    router = Router()
    for method, path, handler in (("POST", "/v1/chat/completions", ok), ("POST", "/v1/refuse", refuse)):
        router.add(method, path, cors.wrap(handler))
        router.add("OPTIONS", path, cors.preflight([method]))
    server = HttpServer(router)
    await server.start()
    try:
        yield server
    finally:
        await asyncio.wait_for(server.close(), WAIT)


def preflight(path: str, origin: str | None) -> bytes:
    headers = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type, authorization"}
    return request("OPTIONS", path, headers={**headers, **({"Origin": origin} if origin else {})})


async def test_preflight_for_an_allowed_origin() -> None:
    async with cors_server(f"{WEB}, http://other.example") as server:
        reply: Reply = await roundtrip(server, preflight("/v1/chat/completions", WEB))
    assert reply.status == 204 and reply.body == b""
    assert reply.headers["access-control-allow-origin"] == WEB
    assert reply.headers["access-control-allow-methods"] == "OPTIONS, POST"
    assert reply.headers["access-control-allow-headers"] == "content-type, authorization"
    assert int(reply.headers["access-control-max-age"]) > 0
    assert reply.headers["allow"] == "OPTIONS, POST"


@pytest.mark.parametrize("origins, origin", [("", WEB), ("http://other.example", WEB), (WEB, None)])
async def test_preflight_without_an_allowed_origin_has_no_cors_headers(origins: str, origin: str | None) -> None:
    async with cors_server(origins) as server:
        reply = await roundtrip(server, preflight("/v1/chat/completions", origin))
    assert reply.status == 204 and reply.headers["allow"] == "OPTIONS, POST"
    assert not [h for h in reply.headers if h.startswith("access-control-")]


async def test_responses_and_errors_carry_the_origin() -> None:
    async with cors_server("*") as server:
        ok = await roundtrip(server, request("POST", "/v1/chat/completions", b"{}", {"Origin": WEB}))
        refused = await roundtrip(server, request("POST", "/v1/refuse", b"{}", {"Origin": WEB}))
        plain = await roundtrip(server, request("POST", "/v1/chat/completions", b"{}"))
    assert ok.status == 200 and ok.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in ok.headers["access-control-expose-headers"]
    assert refused.status == 400 and refused.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-origin" not in plain.headers


def test_parse_origins() -> None:
    assert cors_origins("") == () and cors_origins(" ") == ()
    assert cors_origins("http://a.example/, *") == ("http://a.example", "*")
