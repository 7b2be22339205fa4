"""Helpers for the skippy.http.server tests: a router of test handlers signalling a `Probe`, a server on
port 0, raw HTTP/1.1 requests and replies over asyncio streams, and error-envelope assertions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from skippy.http.errors import HttpError
from skippy.http.server import HttpLimits, HttpServer, Request, Response, Router, StreamResponse, json_response
from skippy.http.sse import SSE_DONE, sse_event

WAIT = 5.0


class Probe:
    """Events the test handlers signal, so tests synchronise on them instead of sleeping."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finalised = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0
        self.interrupted: str | None = None  # what ended a handler or stream early (CancelledError, GeneratorExit)


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
        except BaseException as exc:
            probe.interrupted = type(exc).__name__
            raise
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
        except (asyncio.CancelledError, GeneratorExit) as exc:
            probe.interrupted = type(exc).__name__
            raise
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
async def serving(observer: Any = None, **limits: Any) -> AsyncIterator[tuple[HttpServer, Probe]]:
    """The test router served on port 0 with `limits` (HttpLimits fields) over the defaults."""
    probe = Probe()
    server = HttpServer(make_router(probe), limits=HttpLimits(**limits), observer=observer)
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


async def read_reply(reader: asyncio.StreamReader, head_only: bool = False) -> Reply:
    """Parse one HTTP/1.1 response (Content-Length or chunked), keeping chunk boundaries (`head_only`: the
    answer to a HEAD request, which has no body whatever its Content-Length says)."""

    async def read() -> Reply:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        if head_only:
            return Reply(status, headers, [])
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
        return await read_reply(reader, head_only=raw.startswith(b"HEAD "))
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


async def rejected(server: HttpServer, raw: bytes, status: int, code: str, *, end: bool = False) -> dict[str, Any]:
    """Send `raw` on a fresh connection (then end our side if `end`): the server answers `status` with
    error `code` (returned) and then closes the connection."""
    reader, writer = await connect(server)
    try:
        writer.write(raw)
        if end:
            writer.write_eof()  # done sending, still reading: the server can say what was wrong
        error = assert_error(await read_reply(reader), status, code)
        await assert_closed(reader)
        return error
    finally:
        writer.close()
