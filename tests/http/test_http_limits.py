"""skippy.http.server refusing what it will not serve: malformed or truncated requests (400), an
unsupported HTTP version (505), oversized headers (431) and bodies (413), bad JSON (400). Each
answer is an OpenAI error envelope read by the client before the server closes, and the server
keeps serving other connections."""

from __future__ import annotations

import pytest
from http_helpers import assert_error, connect, rejected, request, roundtrip, serving

pytestmark = pytest.mark.anyio


async def test_bad_request_line_gets_400_and_server_keeps_serving() -> None:
    async with serving() as (server, _):
        error = await rejected(server, b"this is not http\r\n\r\n", 400, "bad_request")
        assert error["message"] == "malformed request: illegal request line: bytearray(b'this is not http')"
        assert_error(await roundtrip(server, b"GET /ping HTTP/1.1\r\nBad Header\r\n\r\n"), 400, "bad_request")
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


@pytest.mark.parametrize("size", [10_000, 200_000])
async def test_huge_headers_get_431(size: int) -> None:
    async with serving(max_header_bytes=8 << 10) as (server, _):
        await rejected(server, request("GET", "/ping", headers={"X-Big": "a" * size}), 431, "request_headers_too_large")
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


async def test_body_over_limit_rejected_on_content_length_without_reading_it() -> None:
    async with serving() as (server, probe):
        head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000\r\n\r\n"  # body never sent
        error = await rejected(server, head, 413, "request_too_large")
        assert error["message"] == f"request body over {4 << 20} bytes" and probe.calls == 0


async def test_chunked_body_over_limit_gets_413() -> None:
    async with serving(max_body_bytes=1000) as (server, probe):
        head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunk = b"400\r\n" + b"x" * 0x400 + b"\r\n"
        assert_error(await roundtrip(server, head + chunk * 3), 413, "request_too_large")
        assert probe.calls == 0


async def test_truncated_body_then_close_server_keeps_serving() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"trunc")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200
        assert probe.calls == 1  # the ping: the handler never saw the truncated request


@pytest.mark.parametrize(("raw", "names"), [
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"trunc", "received 7 bytes, expected 100"),
    (b"GET /ping HTTP/1.1\r\nHo", "peer unexpectedly closed connection"),
], ids=["body", "head"])
async def test_truncated_request_then_half_close_gets_400_naming_it(raw: bytes, names: str) -> None:
    async with serving() as (server, probe):
        error = await rejected(server, raw, 400, "bad_request", end=True)
        assert error["message"].startswith("malformed request: ") and names in error["message"]
        assert probe.calls == 0


async def test_unsupported_http_version_gets_505() -> None:
    async with serving() as (server, probe):
        error = await rejected(server, b"GET /ping HTTP/9.9\r\nHost: t\r\n\r\n", 505, "http_version_not_supported")
        assert error["message"] == "HTTP version 9.9 not supported (HTTP/1.0 and HTTP/1.1 are)"
        assert probe.calls == 0


async def test_bad_json_gets_400_invalid_json() -> None:
    async with serving() as (server, _):
        for body in (b"{nope", b"\xff\xfe"):
            error = assert_error(await roundtrip(server, request("POST", "/echo", body)), 400, "invalid_json")
            assert error["message"].startswith("invalid JSON body: ") and error["type"] == "invalid_request_error"


