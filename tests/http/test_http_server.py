"""skippy.http.server over real sockets: routing, keep-alive, limits, error envelopes, streaming, disconnects."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from skippy.http.errors import HttpError, error_body
from skippy.http.server import HttpServer, Request, Response, Router, StreamResponse, json_response
from skippy.http.sse import SSE_DONE, sse_event

pytestmark = pytest.mark.anyio
WAIT = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Probe:
    """Events the test handlers signal, so tests synchronise on them instead of sleeping."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finalised = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0


def make_router(probe: Probe) -> Router:
    async def ping(req: Request) -> Response:
        probe.calls += 1
        return json_response({"pong": True, "query": req.query})

    async def echo(req: Request) -> Response:
        probe.calls += 1
        return json_response({"got": req.json(), "request_id": req.request_id}, status=201, headers=[("x-extra", "1")])

    async def boom(req: Request) -> Response:
        raise RuntimeError("kaboom")

    async def teapot(req: Request) -> Response:
        raise HttpError(422, "bad temperature", param="temperature", code="bad_value", headers=[("retry-after", "3")])

    async def slow(req: Request) -> Response:
        probe.started.set()
        try:
            await probe.release.wait()
            return json_response({"slow": "done"})
        finally:
            probe.finalised.set()

    async def gen(fail: bool = False, hang: bool = False) -> AsyncIterator[bytes]:
        try:
            for i in range(3):
                yield sse_event({"i": i})
                if hang:
                    probe.started.set()
                    await probe.release.wait()
            if fail:
                raise RuntimeError("stream broke")
            yield SSE_DONE
        finally:
            probe.finalised.set()

    async def stream(req: Request) -> StreamResponse:
        return StreamResponse(gen(fail="fail" in req.query, hang="hang" in req.query))

    router = Router()
    router.add("GET", "/ping", ping)
    router.add("POST", "/echo", echo)
    router.add("GET", "/boom", boom)
    router.add("POST", "/teapot", teapot)
    router.add("GET", "/slow", slow)
    router.add("GET", "/stream", stream)
    return router


@asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[tuple[HttpServer, Probe]]:
    probe = Probe()
    server = HttpServer(make_router(probe), **kwargs)
    await server.start()
    try:
        yield server, probe
    finally:
        await asyncio.wait_for(server.close(), WAIT)


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Reply:
    def __init__(self, status: int, headers: dict[str, str], chunks: list[bytes]) -> None:
        self.status, self.headers, self.chunks = status, headers, chunks
        self.body = b"".join(chunks)

    def json(self) -> Any:
        return json.loads(self.body)


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    """Parse one HTTP/1.1 response (Content-Length or chunked), keeping chunk boundaries."""

    async def read() -> Reply:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                chunks.append((await reader.readexactly(size + 2))[:-2])
            assert await reader.readexactly(2) == b"\r\n"
            return Reply(status, headers, chunks)
        return Reply(status, headers, [await reader.readexactly(int(headers["content-length"]))])

    return await asyncio.wait_for(read(), WAIT)


async def roundtrip(server: HttpServer, raw: bytes) -> Reply:
    reader, writer = await connect(server)
    try:
        writer.write(raw)
        return await read_reply(reader)
    finally:
        writer.close()


async def assert_closed(reader: asyncio.StreamReader) -> None:
    assert await asyncio.wait_for(reader.read(), WAIT) == b""


def assert_error(reply: Reply, status: int, code: str) -> dict[str, Any]:
    assert reply.status == status
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-request-id"]
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    return error


async def test_get_and_post_routing() -> None:
    async with serving() as (server, _):
        reply = await roundtrip(server, request("GET", "/ping?a=1&b="))
        assert reply.status == 200 and reply.json() == {"pong": True, "query": {"a": "1", "b": ""}}
        assert reply.headers["content-type"] == "application/json"
        assert reply.headers["content-length"] == str(len(reply.body))
        reply = await roundtrip(server, request("POST", "/echo", b'{"x": [1, 2]}'))
        assert reply.status == 201 and reply.json()["got"] == {"x": [1, 2]} and reply.headers["x-extra"] == "1"


async def test_not_found_and_method_not_allowed() -> None:
    async with serving() as (server, _):
        assert_error(await roundtrip(server, request("GET", "/nope")), 404, "not_found")
        reply = await roundtrip(server, request("DELETE", "/ping"))
        assert_error(reply, 405, "method_not_allowed")
        assert reply.headers["allow"] == "GET"


async def test_keep_alive_serves_several_requests_including_pipelined() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/ping"))
        assert (await read_reply(reader)).status == 200
        writer.write(request("POST", "/echo", b"[1]") + request("GET", "/ping?n=3"))
        assert (await read_reply(reader)).json()["got"] == [1]
        assert (await read_reply(reader)).json()["query"] == {"n": "3"}
        assert probe.calls == 3
        writer.close()


async def test_chunked_request_body() -> None:
    async with serving() as (server, _):
        head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        reply = await roundtrip(server, head + b"5\r\n{\"a\":\r\n3\r\n 7}\r\n0\r\n\r\n")
        assert reply.status == 201 and reply.json()["got"] == {"a": 7}


async def test_connection_close_and_http10_close_after_response() -> None:
    async with serving() as (server, _):
        for raw in (request("GET", "/ping", headers={"Connection": "close"}), b"GET /ping HTTP/1.0\r\n\r\n"):
            reader, writer = await connect(server)
            writer.write(raw)
            head = await asyncio.wait_for(reader.read(), WAIT)  # the server closes: read to EOF
            assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")) and head.endswith(b'"query": {}}')
            writer.close()


async def test_bad_request_line_gets_400_and_server_keeps_serving() -> None:
    async with serving() as (server, _):
        reader, writer = await connect(server)
        writer.write(b"this is not http\r\n\r\n")
        assert_error(await read_reply(reader), 400, "bad_request")
        await assert_closed(reader)
        writer.close()
        assert_error(await roundtrip(server, b"GET /ping HTTP/1.1\r\nBad Header\r\n\r\n"), 400, "bad_request")
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


@pytest.mark.parametrize("size", [10_000, 200_000])
async def test_huge_headers_get_431(size: int) -> None:
    async with serving(max_header_bytes=8 << 10) as (server, _):
        reader, writer = await connect(server)
        writer.write(request("GET", "/ping", headers={"X-Big": "a" * size}))
        assert_error(await read_reply(reader), 431, "request_headers_too_large")
        await assert_closed(reader)
        writer.close()
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


async def test_body_over_limit_rejected_on_content_length_without_reading_it() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000\r\n\r\n")  # body never sent
        assert_error(await read_reply(reader), 413, "request_too_large")
        await assert_closed(reader)
        writer.close()
        assert probe.calls == 0


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
        assert probe.calls == 1


async def test_bad_json_gets_400_invalid_json() -> None:
    async with serving() as (server, _):
        for body in (b"{nope", b"\xff\xfe"):
            error = assert_error(await roundtrip(server, request("POST", "/echo", body)), 400, "invalid_json")
            assert error["message"].startswith("invalid JSON body: ") and error["type"] == "invalid_request_error"


async def test_handler_exception_gets_500_and_connection_keeps_serving() -> None:
    async with serving() as (server, _):
        reader, writer = await connect(server)
        writer.write(request("GET", "/boom"))
        error = assert_error(await read_reply(reader), 500, "internal_error")
        assert error["message"] == "internal error"
        writer.write(request("GET", "/ping"))
        assert (await read_reply(reader)).status == 200
        writer.close()


async def test_http_error_from_handler() -> None:
    async with serving() as (server, _):
        reply = await roundtrip(server, request("POST", "/teapot", b"{}"))
        error = assert_error(reply, 422, "bad_value")
        assert error == json.loads(error_body("bad temperature", param="temperature", code="bad_value"))["error"]
        assert reply.headers["retry-after"] == "3"


async def test_request_id_echoed_sanitised_or_minted() -> None:
    async with serving() as (server, _):
        reply = await roundtrip(server, request("POST", "/echo", b"1", headers={"X-Request-Id": "abc-123"}))
        assert reply.headers["x-request-id"] == reply.json()["request_id"] == "abc-123"
        reply = await roundtrip(server, request("POST", "/echo", b"1", headers={"X-Request-Id": "a b\tc" + "z" * 300}))
        assert reply.headers["x-request-id"] == ("abc" + "z" * 300)[:128]
        minted = (await roundtrip(server, request("GET", "/ping"))).headers["x-request-id"]
        assert len(minted) == 32 and int(minted, 16) >= 0
        assert minted != (await roundtrip(server, request("GET", "/ping"))).headers["x-request-id"]


async def test_stream_response_sends_chunks_raw() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/stream"))
        reply = await read_reply(reader)
        assert reply.status == 200 and reply.headers["transfer-encoding"] == "chunked"
        assert reply.headers["content-type"] == "text/event-stream" and reply.headers["x-request-id"]
        assert reply.chunks == [b'data: {"i":0}\n\n', b'data: {"i":1}\n\n', b'data: {"i":2}\n\n', SSE_DONE]
        assert probe.finalised.is_set()
        writer.write(request("GET", "/ping"))  # the connection is still usable after a stream
        assert (await read_reply(reader)).status == 200
        writer.close()


async def test_stream_response_with_http_client() -> None:
    def fetch(port: int) -> tuple[int, str | None, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        try:
            conn.request("GET", "/stream")
            resp = conn.getresponse()
            return resp.status, resp.getheader("content-type"), resp.read()
        finally:
            conn.close()

    async with serving() as (server, _):
        status, ctype, body = await asyncio.wait_for(asyncio.to_thread(fetch, server.port), WAIT)
        assert (status, ctype) == (200, "text/event-stream")
        assert body.split(b"\n\n")[:-1] == [b'data: {"i":0}', b'data: {"i":1}', b'data: {"i":2}', b"data: [DONE]"]


async def test_stream_iterator_error_ends_stream_cleanly() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/stream?fail=1"))
        reply = await read_reply(reader)
        assert reply.status == 200 and len(reply.chunks) == 3
        assert probe.finalised.is_set()
        await assert_closed(reader)
        writer.close()


async def test_client_disconnect_mid_stream_cancels_generator() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/stream?hang=1"))
        await asyncio.wait_for(reader.readuntil(b'data: {"i":0}\n\n'), WAIT)
        await asyncio.wait_for(probe.started.wait(), WAIT)
        writer.close()
        await asyncio.wait_for(probe.finalised.wait(), WAIT)
        assert not probe.release.is_set()
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


async def test_client_disconnect_cancels_pending_handler() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/slow"))
        await asyncio.wait_for(probe.started.wait(), WAIT)
        writer.close()
        await asyncio.wait_for(probe.finalised.wait(), WAIT)
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


async def test_slow_connection_does_not_block_others_and_close_cancels_handlers() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/slow"))
        await asyncio.wait_for(probe.started.wait(), WAIT)
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200
        await asyncio.wait_for(server.close(), WAIT)
        assert probe.finalised.is_set()
        await assert_closed(reader)
        writer.close()


async def test_slow_handler_completes_when_released() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/slow"))
        await asyncio.wait_for(probe.started.wait(), WAIT)
        probe.release.set()
        assert (await read_reply(reader)).json() == {"slow": "done"}
        writer.close()


async def test_idle_connection_closed_after_timeout() -> None:
    async with serving(idle_timeout_s=0.2) as (server, _):
        reader, writer = await connect(server)
        writer.write(request("GET", "/ping"))
        assert (await read_reply(reader)).status == 200
        await assert_closed(reader)  # nothing more sent: the server hangs up after idle_timeout_s
        writer.close()


def test_sse_event_framing() -> None:
    assert sse_event({"a": 1, "b": "é"}) == 'data: {"a":1,"b":"é"}\n\n'.encode()
    assert sse_event("hello") == b"data: hello\n\n"
    assert sse_event("one\ntwo") == b"data: one\ndata: two\n\n"
    assert SSE_DONE == b"data: [DONE]\n\n"
