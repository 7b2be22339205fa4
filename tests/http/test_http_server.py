"""skippy.http.server over real sockets: routing, keep-alive, handler errors, request ids, streaming,
client disconnects, idle timeout (malformed requests and size limits: test_http_limits.py)."""

from __future__ import annotations

import asyncio
import http.client
import json

import pytest
from http_helpers import WAIT, assert_closed, assert_error, connect, read_reply, request, roundtrip, serving

from skippy.http.errors import error_body
from skippy.http.sse import SSE_DONE, sse_event

pytestmark = pytest.mark.anyio


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
        assert not probe.release.is_set() and probe.interrupted == "CancelledError"
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


async def test_client_disconnect_cancels_pending_handler() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/slow"))
        await asyncio.wait_for(probe.started.wait(), WAIT)
        writer.close()
        await asyncio.wait_for(probe.finalised.wait(), WAIT)
        assert probe.interrupted == "CancelledError"  # cancelled mid-wait, not finished
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200


async def test_slow_connection_does_not_block_others_and_close_cancels_handlers() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/slow"))
        await asyncio.wait_for(probe.started.wait(), WAIT)
        assert (await roundtrip(server, request("GET", "/ping"))).status == 200
        await asyncio.wait_for(server.close(), WAIT)
        assert probe.finalised.is_set() and probe.interrupted == "CancelledError"
        await assert_closed(reader)
        writer.close()


async def test_slow_handler_completes_when_released() -> None:
    async with serving() as (server, probe):
        reader, writer = await connect(server)
        writer.write(request("GET", "/slow"))
        await asyncio.wait_for(probe.started.wait(), WAIT)
        probe.release.set()
        assert (await read_reply(reader)).json() == {"slow": "done"}
        assert probe.finalised.is_set() and probe.interrupted is None
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
