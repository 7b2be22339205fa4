"""Plain helpers for the broker tests: a protocol-level client, a scripted fake stage 0, a broker in the loop.

`BrokerClient` is an adapter as the broker sees it (a DEALER speaking Submit / Cancel /
StatusQuery) that keeps every TokenEvents message whole, so tests can assert error codes.
`FakeStage0` is a ROUTER that answers Status as told and records Submits, for fast tests of
what a real pipeline does not do on demand (go silent, send codeless errors, logprobs).
`Clock` is a time source the test moves by hand (the broker's and AdaptiveConcurrency's `clock`).
`PipelineProcs` is a started pipeline of real stage processes (made by conftest.py's fixtures; it
lives here because test modules cannot import from conftest: another test directory has one too).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq.asyncio

from brokers import Broker
from skippy.config import AdmissionOptions, StageTopology
from skippy.launcher import StageProcesses
from skippy.log import configure_logging
from skippy.protocol import Cancel, EventBatch, Status, StatusQuery, Submit, TokenEvents, events_of
from skippy.transport.endpoints import request_endpoint
from skippy.transport.queues import DealerQueue, RouterQueue

TEST_TIMEOUT_S = 60.0
WAIT_S = 15.0  # bound on any single wait for an event


def run(coro: Coroutine[Any, Any, Any], timeout: float = TEST_TIMEOUT_S) -> Any:
    """Run an async test body with an overall bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@dataclass
class PipelineProcs:
    topology: Path
    stages: StageProcesses

    @property
    def request_endpoint(self) -> str:
        return request_endpoint(StageTopology.load(self.topology).first().endpoint)


class Clock:
    """A clock that only moves when the test sets `now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Stream:
    """Everything one request got back: its tokens, the final TokenEvents, and when they came."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.tokens: list[int] = []
        self.messages: list[TokenEvents] = []
        self.final: TokenEvents | None = None
        self.first_token_at: float | None = None
        self.final_at: float | None = None
        self.done = asyncio.Event()
        self._progress = asyncio.Event()

    def put(self, msg: TokenEvents) -> None:
        self.messages.append(msg)
        if msg.tokens and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.tokens.extend(msg.tokens)
        if msg.finish_reason is not None:
            self.final, self.final_at = msg, time.monotonic()
            self.done.set()
        self._progress.set()

    async def finished(self, timeout_s: float = WAIT_S) -> TokenEvents:
        await asyncio.wait_for(self.done.wait(), timeout_s)
        assert self.final is not None
        return self.final

    async def decoding(self, n: int = 3, timeout_s: float = WAIT_S) -> None:
        """Wait until at least `n` tokens arrived (or the request ended)."""
        async def reach() -> None:
            while len(self.tokens) < n and not self.done.is_set():
                self._progress.clear()
                await self._progress.wait()

        await asyncio.wait_for(reach(), timeout_s)


class BrokerClient:
    def __init__(self, endpoint: str, ctx: zmq.asyncio.Context) -> None:
        self.queue = DealerQueue(ctx, endpoint)
        self.streams: dict[str, Stream] = {}
        self._status: dict[int, asyncio.Future[Status]] = {}
        self._nonces = itertools.count(1)
        self._ids = itertools.count(1)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            msg = await self.queue.recv()
            if isinstance(msg, TokenEvents | EventBatch):
                for event in events_of(msg):
                    self.streams[event.request_id].put(event)
            elif isinstance(msg, Status):
                self._status.pop(msg.nonce).set_result(msg)
            else:
                raise AssertionError(f"unexpected message from the broker: {msg!r}")

    async def submit(self, prompt: Sequence[int] = (5, 6, 7, 8), max_tokens: int = 40,
                     request_id: str | None = None, events_to: str | None = None) -> Stream:
        request_id = request_id or f"req-{next(self._ids)}"
        stream = self.streams[request_id] = Stream(request_id)
        await self.queue.send(Submit(request_id, tuple(prompt), {}, max_tokens, (), events_to))
        return stream

    async def cancel(self, request_id: str, events_to: str | None = None) -> None:
        await self.queue.send(Cancel(request_id, events_to))

    async def status(self, timeout_s: float = 5.0) -> Status:
        nonce = next(self._nonces)
        future = self._status[nonce] = asyncio.get_running_loop().create_future()
        await self.queue.send(StatusQuery(nonce))
        return await asyncio.wait_for(future, timeout_s)

    def close(self) -> None:
        self._reader.cancel()
        self.queue.close()


class FakeStage0:
    """A stage 0 request endpoint under test control: Status as set, Submits recorded, events sent on demand."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, lane_count: int = 2, ctx_size: int = 512) -> None:
        self.router = RouterQueue(ctx, endpoint)
        self.endpoint = self.router.endpoint
        self.ready, self.dead_stage, self.silent = True, None, False
        self.lane_count, self.ctx_size = lane_count, ctx_size
        self.submits: asyncio.Queue[tuple[bytes, Submit]] = asyncio.Queue()
        self.cancels: asyncio.Queue[str] = asyncio.Queue()
        self.answered = 0  # nonce of the last Status sent
        self.ignored = asyncio.Event()  # a StatusQuery went unanswered (every earlier one was answered)
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            client, msg = await self.router.recv()
            if isinstance(msg, StatusQuery) and self.silent:
                self.ignored.set()
            elif isinstance(msg, StatusQuery):
                await self.router.send(client, Status(msg.nonce, self.ready, self.dead_stage, 0, 0, self.lane_count,
                                                      self.ctx_size))
                self.answered = msg.nonce
            elif isinstance(msg, Submit):
                self.submits.put_nowait((client, msg))
            elif isinstance(msg, Cancel):
                self.cancels.put_nowait(msg.request_id)

    async def next_submit(self, timeout_s: float = WAIT_S) -> tuple[bytes, Submit]:
        return await asyncio.wait_for(self.submits.get(), timeout_s)

    async def next_cancel(self, timeout_s: float = WAIT_S) -> str:
        return await asyncio.wait_for(self.cancels.get(), timeout_s)

    async def send(self, client: bytes, msg: TokenEvents) -> None:
        await self.router.send(client, msg)

    def close(self) -> None:
        self._task.cancel()
        self.router.close()


@contextlib.asynccontextmanager
async def running_broker(pipelines: Sequence[str], admission: AdmissionOptions | None = None, *,
                         bind: str = "tcp://127.0.0.1:0", **kwargs: Any) -> AsyncIterator[tuple[Broker, BrokerClient]]:
    """A started Broker at `bind` (default a tcp port), ready, with a client connected (on its own context, so
    the test may close the broker first and still read what it sent); both closed on exit."""
    configure_logging("summary", stream=sys.stderr, role="test-broker")
    broker = Broker(bind, pipelines, admission, **kwargs)
    await broker.start()
    ctx = zmq.asyncio.Context()
    client = BrokerClient(broker.endpoint, ctx)
    try:
        await broker.wait_until(lambda: broker.ready, WAIT_S)
        yield broker, client
    finally:
        await broker.close()
        client.close()
        ctx.term()
