"""Slow clients cannot hold skippy.http.server: a request head or body trickled in slower than its deadline
(a deadline over all the reads, not per read) is answered 408 and closed, a connection that sends
nothing is closed at the head deadline, an idle kept-alive connection at the idle timeout, and a
connection past the cap gets a 503 unread; each is one log line naming the peer and the reason and is
told to the observer (the adapter's /metrics counts them), while real requests on other connections are
served. Real server on port 0, real sockets; the test's waits are bounded polls, never timed claims."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from adapter_helpers import adapter_server
from http_helpers import WAIT, assert_closed, assert_error, connect, read_reply, request, roundtrip, serving
from structlog.testing import capture_logs

from skippy.http.server import HttpLimits, HttpServer

pytestmark = pytest.mark.anyio

POLL_S = 0.1  # how long the trickling client waits for an answer before sending its next piece
PIECES = 500  # bounds a trickle: far more pieces than fit in any deadline the tests set


class Recorder:
    """A ConnectionObserver keeping what it was told, and a way to wait (bounded) until something holds."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.timed_out: list[str] = []
        self.open = 0
        self._changed = asyncio.Event()

    def connection_refused(self, reason: str) -> None:
        self.refused.append(reason)
        self._changed.set()

    def connection_timed_out(self, reason: str) -> None:
        self.timed_out.append(reason)
        self._changed.set()

    def connections_open(self, count: int) -> None:
        self.open = count
        self._changed.set()

    async def until(self, holds: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not holds():
                self._changed.clear()
                await self._changed.wait()


async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pieces: list[bytes]) -> bytes:
    """Send `pieces` one at a time, each after the server said nothing for POLL_S; what the server sent
    once it answered or closed (b"" for a close without an answer)."""
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(65536), POLL_S)
        except TimeoutError:
            continue
        return data + await asyncio.wait_for(reader.read(), WAIT) if data else data
    raise AssertionError("the server kept the trickling connection open")


def closed_lines(logs: Sequence[Mapping[str, Any]], event: str = "http_connection_closed") -> list[Mapping[str, Any]]:
    return [line for line in logs if line["event"] == event]


async def test_a_trickled_head_is_closed_at_its_deadline_while_another_connection_is_served() -> None:
    recorder = Recorder()
    with capture_logs() as logs:
        async with serving(recorder, head_timeout_s=0.5, idle_timeout_s=WAIT) as (server, probe):
            reader, writer = await connect(server)
            writer.write(b"GET /ping HTTP/1.1\r\n")
            assert (await roundtrip(server, request("GET", "/ping"))).status == 200  # served meanwhile
            lines = [f"X-Slow-{i}: {i}\r\n".encode() for i in range(PIECES)]  # each read well inside any per-read timeout
            answer = await trickle(reader, writer, lines)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer
            body = answer.partition(b"\r\n\r\n")[2]
            assert b'"code": "request_timeout"' in body and b"request head not received within 0.5 s" in body
            assert recorder.timed_out == ["head_timeout"] and probe.calls == 1
            assert (await roundtrip(server, request("GET", "/ping"))).status == 200
    (line,) = closed_lines(logs)
    assert line["reason"] == "head_timeout" and line["status"] == 408 and str(line["peer"]).startswith("127.0.0.1:")


async def test_a_trickled_body_is_closed_at_its_deadline_and_never_reaches_the_handler() -> None:
    recorder = Recorder()
    with capture_logs() as logs:
        async with serving(recorder, body_timeout_s=0.5, idle_timeout_s=WAIT) as (server, probe):
            reader, writer = await connect(server)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            answer = await trickle(reader, writer, [b"x"] * PIECES)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert b"request body not received within 0.5 s" in answer
            assert recorder.timed_out == ["body_timeout"] and probe.calls == 0
    (line,) = closed_lines(logs)
    assert (line["reason"], line["status"], line["method"], line["path"]) == ("body_timeout", 408, "POST", "/echo")


async def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline_without_an_answer() -> None:
    recorder = Recorder()
    async with serving(recorder, head_timeout_s=0.3) as (server, _):
        reader, writer = await connect(server)
        await assert_closed(reader)  # EOF, no response bytes
        writer.close()
        assert recorder.timed_out == ["head_timeout"]


async def test_an_idle_keep_alive_connection_is_closed_between_requests() -> None:
    recorder = Recorder()
    async with serving(recorder, idle_timeout_s=0.3) as (server, _):
        reader, writer = await connect(server)
        for _ in range(2):  # kept alive: the idle timeout counts only between requests
            writer.write(request("GET", "/ping"))
            assert (await read_reply(reader)).status == 200
        await assert_closed(reader)
        writer.close()
        assert recorder.timed_out == ["idle_timeout"]


async def test_a_connection_past_the_cap_gets_503_and_requests_are_served_once_idle_ones_close() -> None:
    recorder = Recorder()
    with capture_logs() as logs:
        async with serving(recorder, max_connections=3, head_timeout_s=0.5) as (server, _):
            idle = [await connect(server) for _ in range(3)]  # a flood of sockets that never send
            await recorder.until(lambda: recorder.open == 3)
            extra = await roundtrip(server, request("GET", "/ping"))
            error = assert_error(extra, 503, "too_many_connections")
            assert error["type"] == "service_unavailable" and "at most 3" in error["message"]
            assert extra.headers["connection"] == "close" and extra.headers["retry-after"] == "1"
            assert recorder.refused == ["max_connections"]
            for reader, writer in idle:  # the server closes them at the head deadline: the cap frees itself
                await assert_closed(reader)
                writer.close()
            await recorder.until(lambda: recorder.open == 0)
            assert (await roundtrip(server, request("GET", "/ping"))).status == 200
    (refusal,) = closed_lines(logs, "http_connection_refused")
    assert refusal["reason"] == "max_connections" and refusal["limit"] == 3 and "peer" in refusal
    assert [line["reason"] for line in closed_lines(logs)] == ["head_timeout"] * 3


def samples(text: str, name: str) -> dict[str, float]:
    return {line.partition("{")[2].rpartition("}")[0]: float(line.rpartition(" ")[2])
            for line in text.splitlines() if line.startswith(name)}


async def test_the_adapter_counts_refusals_and_slow_clients_on_its_metrics(tiny_model: Callable[..., Path]) -> None:
    limits = HttpLimits(head_timeout_s=0.5, max_connections=2)
    async with adapter_server(tiny_model("llama"), limits=limits) as (server, _):
        silent = await connect(server)
        metrics_conn = await connect(server)  # kept alive for the scrape (the cap is 2): a first request now
        metrics_conn[1].write(request("GET", "/health"))
        assert (await read_reply(metrics_conn[0])).status == 200
        third = await roundtrip(server, request("GET", "/health"))
        assert_error(third, 503, "too_many_connections")
        await assert_closed(silent[0])
        silent[1].close()
        page = await scrape(server, metrics_conn)
        metrics_conn[1].close()
    assert samples(page, "skippy_http_connections_refused_total") == {'reason="max_connections"': 1.0}
    assert samples(page, "skippy_http_slow_clients_closed_total") == {
        'reason="head_timeout"': 1.0, 'reason="body_timeout"': 0.0, 'reason="idle_timeout"': 0.0}
    assert samples(page, "skippy_http_connections_open") == {"": 1.0}


async def scrape(server: HttpServer, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> str:
    conn[1].write(request("GET", "/metrics"))
    reply = await read_reply(conn[0])
    assert reply.status == 200
    return reply.body.decode()
