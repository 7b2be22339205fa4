"""The broker's relay toward an adapter that does not read is bounded, counted, and fails the request.

A scripted stage 0 (`FakeStage0`) streams a request's events as fast as the test sends them to a broker
whose queue toward each adapter holds `relay_hwm` = 4 messages; the adapter is a DEALER that never reads.
Once its queue is full the next event is not dropped in silence: the request is cancelled at stage 0,
finished with slow_client (`skippy_broker_requests_total{outcome="slow_client"}`), the refusals counted in
`skippy_broker_relay_overflow_total{reason="full"}` and logged once. Meanwhile another adapter is served
every event and status; when the stalled adapter reads again it gets the tokens it had, in order, then
the error (tried again until its queue took it), never a hang. An adapter gone mid-request: the same,
reason gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from broker_helpers import WAIT_S, FakeStage0, run, running_broker

from brokers import Broker
from skippy.protocol import ErrorCode, FinishReason, Submit, TokenEvents, decode, encode

RELAY_HWM = 4
BURST = 500  # events the fake stage 0 sends at a time while waiting for the broker's cancel


def _stalled_adapter(endpoint: str) -> tuple[zmq.Context[Any], zmq.Socket[bytes]]:
    """An adapter's DEALER that holds one message and reads only when the test says."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.linger = 0
    sock.connect(endpoint)
    return ctx, sock


async def _stream_until_cancelled(stage0: FakeStage0, peer: bytes, rid: str) -> int:
    """Events for `rid` as fast as a pipeline could make them, until the broker cancels it; how many were sent."""
    sent = 0
    while True:
        assert sent < 400 * BURST, "no cancel: the broker queues the relay somewhere without bound"
        for _ in range(BURST):
            await stage0.send(peer, TokenEvents(rid, (sent % 1000,), None))
            sent += 1
        try:
            assert await asyncio.wait_for(stage0.next_cancel(), 0.05) == rid  # poll interval of a bounded poll
            return sent
        except TimeoutError:
            pass


def _read_all(sock: zmq.Socket[bytes], rid: str) -> list[TokenEvents]:
    """Everything the broker sends `sock` for `rid`, up to its final event (bounded waits)."""
    got: list[TokenEvents] = []
    while not got or got[-1].finish_reason is None:
        assert sock.poll(int(WAIT_S * 1000)), f"no final event within {WAIT_S:g} s after {len(got)} messages"
        msg = decode(sock.recv_multipart(copy=False))
        assert isinstance(msg, TokenEvents) and msg.request_id == rid, msg
        got.append(msg)
    return got


def _relay_overflow(broker: Broker, reason: str) -> float:
    return broker.telemetry.registry.get_sample_value("skippy_broker_relay_overflow_total", {"reason": reason}) or 0.0


@contextlib.asynccontextmanager
async def _relay_broker(tmp_path: Path) -> AsyncIterator[tuple[Broker, Any, FakeStage0]]:
    """A broker relaying with `relay_hwm` = RELAY_HWM in front of a scripted stage 0; both closed after."""
    ctx = zmq.asyncio.Context()
    stage0 = FakeStage0(ctx, f"ipc://{tmp_path}/fake.req", lane_count=4)
    try:
        async with running_broker([stage0.endpoint], bind=f"ipc://{tmp_path}/broker.sock",
                                  relay_hwm=RELAY_HWM) as (broker, client):
            yield broker, client, stage0
    finally:
        stage0.close()
        ctx.term()


def test_an_adapter_that_does_not_read_has_its_request_failed_not_cut(tmp_path: Path) -> None:
    async def body() -> None:
        async with _relay_broker(tmp_path) as (broker, client, stage0):
            lines: list[tuple[str, dict[str, Any]]] = []
            broker.relay_overflow.log = _Lines(lines)
            stalled_ctx, stalled = _stalled_adapter(broker.endpoint)
            try:
                stalled.send_multipart(encode(Submit("stuck", (5, 6), {}, 10**6, (), None)))
                peer, submit = await stage0.next_submit()
                assert submit.request_id == "stuck"
                sent = await _stream_until_cancelled(stage0, peer, "stuck")
                await broker.wait_until(lambda: not broker.requests, WAIT_S)  # finished here, its permit free
                assert broker.outcomes["slow_client"] == 1 and broker.queue.running == 0
                assert _relay_overflow(broker, "full") >= 1
                assert [event for event, _ in lines].count("relay_overflow") == 1  # once, not per event
                await stage0.send(peer, TokenEvents("stuck", (1,), None))  # late events of it go nowhere
                await stage0.send(peer, TokenEvents("stuck", (), FinishReason.CANCELLED))

                # another adapter is served meanwhile: every event, and its status
                fine = await client.submit(request_id="fine")
                peer, _ = await stage0.next_submit()
                for token in range(20):  # as decode steps make them: one, read, the next (a burst may overflow too)
                    await stage0.send(peer, TokenEvents("fine", (token,), None))
                    await fine.decoding(token + 1)
                await stage0.send(peer, TokenEvents("fine", (), FinishReason.LENGTH))
                assert (await fine.finished()).finish_reason == FinishReason.LENGTH
                assert fine.tokens == list(range(20))
                assert (await client.status()).ready

                # the stalled adapter reads again: the tokens it had, in order and without a gap, then the error
                got = await asyncio.to_thread(_read_all, stalled, "stuck")
                tokens = [t for m in got[:-1] for t in m.tokens]
                assert tokens == [i % 1000 for i in range(len(tokens))] and len(tokens) < sent
                final = got[-1]
                assert (final.finish_reason, final.code) == (FinishReason.ERROR, ErrorCode.SLOW_CLIENT)
                assert "not reading" in (final.error or "")
                ended = [fields["refused"] for event, fields in lines if event == "relay_overflow_ended"]
                assert ended in ([1], [2]), lines  # the event, and the error too unless the queue had room again
            finally:
                stalled.close(0)
                stalled_ctx.term()

    run(body())


def test_an_adapter_gone_mid_request_has_its_request_cancelled(tmp_path: Path) -> None:
    async def body() -> None:
        async with _relay_broker(tmp_path) as (broker, _client, stage0):
            gone_ctx, gone = _stalled_adapter(broker.endpoint)
            gone.send_multipart(encode(Submit("orphan", (5, 6), {}, 100, (), None)))
            peer, _ = await stage0.next_submit()
            gone.close(0)
            gone_ctx.term()
            assert await _stream_until_cancelled(stage0, peer, "orphan") > 0
            await broker.wait_until(lambda: not broker.requests, WAIT_S)
            assert broker.outcomes["slow_client"] == 1 and _relay_overflow(broker, "gone") >= 1

    run(body())


class _Lines:
    """A logger that keeps its lines in `lines`."""

    def __init__(self, lines: list[tuple[str, dict[str, Any]]]) -> None:
        self.lines = lines

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    info = warning
