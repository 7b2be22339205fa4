"""Stage 0's direct token events toward a client that does not read: bounded, counted, the request failed.

The request endpoint (`RequestEndpoint`, real ROUTER and sockets) serves a scripted stage 0 whose
requests produce as many events as the test puts in. A client whose event PULL never reads gets its
request failed with slow_client through the submitter once its socket has held `max_queued` events for
`patience_s` (nothing queues in stage 0 past ZeroMQ's high-water mark), the request is cancelled at stage 0, the refusal is
counted and logged once for the episode, while a client that reads is served every event in order and
status queries are answered. A request to the stalled client sent while its socket is still full (as to an
adapter restarted on the same endpoint) waits for room and is served once the client reads again, after the
events left before it, and the episode's end is logged.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from scripted_stage0 import ScriptedStage0

from skippy.driver.direct_events import EventSinks
from skippy.driver.requests import RequestEndpoint
from skippy.protocol import (
    ErrorCode,
    EventBatch,
    FinishReason,
    StatusQuery,
    Submit,
    TokenEvents,
    decode,
    events_of,
)
from skippy.transport.queues import DealerQueue, RouterQueue

MAX_QUEUED = 4
PATIENCE_S = 0.2  # an event waits this long for room before its request fails (the test's; serving waits longer)
WAIT_S = 15.0  # bound on each wait
BURST = 2000  # events put in at a time while waiting for the overflow


class CountingSinks(EventSinks):
    """EventSinks that count the tokens each endpoint's socket took."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taken: dict[str, int] = {}

    async def send(self, endpoint: str, msg: TokenEvents | EventBatch) -> bool:
        took = await super().send(endpoint, msg)
        tokens = sum(len(e.tokens) for e in events_of(msg)) if took else 0
        self.taken[endpoint] = self.taken.get(endpoint, 0) + tokens
        return took


class Log:
    """A logger that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _line(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))

    def __getattr__(self, level: str) -> Any:
        return self._line(level)

    def events(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        return [(level, fields) for level, event, fields in self.lines if event == name]


async def _recv(queue: DealerQueue) -> Any:
    return await asyncio.wait_for(queue.recv(), WAIT_S)


def _events_pull(ctx: zmq.asyncio.Context, endpoint: str) -> zmq.Socket[bytes]:
    """A client's event endpoint: a PULL that holds one message and reads only when the test says."""
    pull: zmq.Socket[bytes] = ctx.socket(zmq.PULL, socket_class=zmq.Socket)  # type: ignore[arg-type,assignment]
    pull.setsockopt(zmq.RCVHWM, 1)
    pull.bind(endpoint)
    return pull


def _drain(pull: zmq.Socket[bytes]) -> list[TokenEvents]:
    got = []
    while True:
        try:
            msg = decode(pull.recv_multipart(zmq.NOBLOCK, copy=False))
        except zmq.Again:
            return got
        assert isinstance(msg, TokenEvents | EventBatch)
        got += events_of(msg)


def test_a_client_that_does_not_read_is_failed_within_the_bound(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        stage0, log, counted = ScriptedStage0(), Log(), itertools.count()
        sinks = CountingSinks(max_queued=MAX_QUEUED, patience_s=PATIENCE_S)
        endpoint = RequestEndpoint(stage0, sinks, log, events_to_overflow=lambda: next(counted))
        router = RouterQueue(ctx, f"ipc://{tmp_path}/req.sock")
        serving = asyncio.get_running_loop().create_task(endpoint.serve(router))
        stalled_at, reading_at = f"ipc://{tmp_path}/stalled.sock", f"ipc://{tmp_path}/reading.sock"
        stalled, reading = _events_pull(ctx, stalled_at), _events_pull(ctx, reading_at)
        submitter = DealerQueue(ctx, router.endpoint)
        try:
            await submitter.send(Submit("stuck", (1, 2), {}, 10**6, (), stalled_at))
            assert await asyncio.wait_for(stage0.submitted.get(), WAIT_S) == "stuck"
            stuck = stage0.handles["stuck"]
            put = 0
            final: Any = None
            while final is None:  # steps as fast as stage 0 makes them, until its socket toward the client is full
                assert put < 200 * BURST, "no overflow: the events queue somewhere without bound"
                for _ in range(BURST):  # one step's events of the request: they leave as one message
                    stuck.put(TokenEvents("stuck", (put % 1000,)))
                    put += 1
                try:
                    final = await asyncio.wait_for(submitter.recv(), 0.2)  # poll interval of a bounded poll
                except TimeoutError:
                    pass
            assert isinstance(final, TokenEvents) and final.request_id == "stuck"
            assert (final.finish_reason, final.code) == (FinishReason.ERROR, ErrorCode.SLOW_CLIENT)
            assert stalled_at in (final.error or "") and final.sent_direct is None
            assert stage0.cancelled == ["stuck"]
            sink = sinks._sinks[stalled_at]
            assert not sink._socket._sends and sink._socket.socket.getsockopt(zmq.SNDHWM) == MAX_QUEUED  # none in stage 0
            assert sinks.taken[stalled_at] < put  # the rest was never queued anywhere
            assert next(counted) == 1 and len(log.events("events_to_overflow")) == 1
            await asyncio.wait_for(_no_senders(endpoint), WAIT_S)  # the stuck request's events stop there

            # a client that reads is served meanwhile: every event, in order, the final copy to the submitter
            await submitter.send(Submit("fine", (1, 2), {}, 50, (), reading_at))
            assert await asyncio.wait_for(stage0.submitted.get(), WAIT_S) == "fine"
            got = []
            for token in range(50):  # as decode steps make them: one, read, the next
                stage0.handles["fine"].put(TokenEvents("fine", (token,)))
                got += await _read(reading, 1)
            stage0.handles["fine"].put(TokenEvents("fine", (), FinishReason.LENGTH))
            copy = await _recv(submitter)
            assert (copy.request_id, copy.finish_reason, copy.sent_direct) == ("fine", FinishReason.LENGTH, 50)
            got += await _read_until_final(reading)
            assert [t for m in got for t in m.tokens] == list(range(50)) and got[-1].finish_reason == FinishReason.LENGTH
            await submitter.send(StatusQuery(7))
            assert (await _recv(submitter)).nonce == 7

            # a new request to the stalled client while its socket is still full (a client restarted on the same
            # endpoint, which has not drained what its predecessor left): its events wait for room, not refused
            sinks.patience_s = WAIT_S
            await submitter.send(Submit("later", (1, 2), {}, 3, (), stalled_at))
            assert await asyncio.wait_for(stage0.submitted.get(), WAIT_S) == "later"
            for token in (7, 8):  # the socket still holds the stuck request's events: these wait
                stage0.handles["later"].put(TokenEvents("later", (token,)))
            stage0.handles["later"].put(TokenEvents("later", (), FinishReason.STOP))  # one step: one message
            left = sinks.taken[stalled_at]
            # the stalled client reads again: the left events come first, in order, then the new request's; the
            # episode ends
            got = await _read_until_final(stalled)  # the stuck request's final went nowhere: this one is later's
            assert [m.request_id for m in got][-1] == "later" and {m.request_id for m in got[:-1]} == {"stuck"}
            assert got[-1].tokens == (7, 8) and got[-1].finish_reason == FinishReason.STOP
            assert [t for m in got for t in m.tokens] == [i % 1000 for i in range(left)] + [7, 8]  # in order, no gap
            copy = await _recv(submitter)
            assert (copy.request_id, copy.finish_reason, copy.sent_direct) == ("later", FinishReason.STOP, 2)
            assert [fields["refused"] for _, fields in log.events("events_to_overflow_ended")] == [1]
            assert len(log.events("events_to_overflow")) == 1
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            submitter.close()
            router.close()
            stalled.close(linger=0)
            reading.close(linger=0)
            sinks.close(linger_ms=0)
            ctx.term()

    asyncio.run(asyncio.wait_for(body(), 120.0))


async def _no_senders(endpoint: RequestEndpoint) -> None:
    while endpoint.senders:
        await asyncio.sleep(0.01)  # poll interval of a bounded poll (the caller bounds it)


async def _read_until_final(pull: zmq.Socket[bytes]) -> list[TokenEvents]:
    """Events from `pull` up to and including a final one (bounded)."""
    got: list[TokenEvents] = []
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not got or got[-1].finish_reason is None:
        assert asyncio.get_running_loop().time() < deadline, f"no final event within {WAIT_S:g} s: {got[-3:]}"
        got += _drain(pull)
        await asyncio.sleep(0.01)  # poll interval of a bounded poll
    return got


async def _read(pull: zmq.Socket[bytes], n: int) -> list[TokenEvents]:
    """The next `n` events from `pull` (bounded)."""
    got: list[TokenEvents] = []
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while len(got) < n:
        assert asyncio.get_running_loop().time() < deadline, f"{len(got)} of {n} events within {WAIT_S:g} s"
        got += _drain(pull)
        await asyncio.sleep(0.01)  # poll interval of a bounded poll
    return got
