"""Stage 0's queue of requests waiting for a lane is bounded: a flood of direct submits past it is refused.

A real pipeline (stage 1 a process, stage 0's driver here) with 2 lanes and `max_waiting` 3; its request
endpoint (`RequestEndpoint`, a real ROUTER) gets 30 Submits at once from a client that talks to stage 0
directly, as `skippy generate` does. The waiting queue never holds more than 3; the rest are answered
queue_full (HTTP 429), counted in `skippy_driver_waiting_refused_total` and logged once per episode, not
per request; the admitted ones are served every token, and a request after the flood is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq.asyncio
from pipeline_helpers import Pipeline, run, running_driver

from skippy.driver.direct_events import EventSinks
from skippy.driver.requests import RequestEndpoint
from skippy.driver.sequence import Sequence
from skippy.log import configure_logging
from skippy.protocol import ErrorCode, EventBatch, FinishReason, Submit, TokenEvents, events_of
from skippy.protocol.kinds import http_status
from skippy.transport.queues import DealerQueue, RouterQueue

LANES, MAX_WAITING, FLOOD, MAX_TOKENS = 2, 3, 30, 24
WAIT_S = 60.0  # bound on the wait for every answer


@contextlib.contextmanager
def logged() -> Iterator[Callable[[str], list[dict[str, Any]]]]:
    """While inside, this process's stderr (where `running_driver` sets the driver's log) is a buffer; yields
    a reader of its events by name. Logging goes back to the real stderr on exit."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            yield lambda event: [e for line in buffer.getvalue().splitlines() if line.startswith("{")
                                 and (e := json.loads(line)).get("event") == event]
    finally:
        configure_logging("summary", stream=sys.stderr, stage_id="stage0", role="test-driver")


def test_a_flood_of_direct_submits_is_refused_past_the_waiting_bound(tiny_model: Callable[..., Path],
                                                                     make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=LANES, ctx_size=256)

    async def body() -> None:
        with logged() as events:
            async with running_driver(pipe, max_waiting=MAX_WAITING) as driver:
                waiting: list[int] = []  # the waiting queue's length after every request taken
                add = driver.table.add

                def add_seen(seq: Sequence) -> None:
                    add(seq)
                    waiting.append(len(driver.table.waiting))

                driver.table.add = add_seen  # type: ignore[method-assign]
                sinks = EventSinks()
                endpoint = RequestEndpoint(driver, sinks, driver.log)
                router = RouterQueue(driver.ctx, f"ipc://{pipe.directory}/req.sock")
                serving = asyncio.get_running_loop().create_task(endpoint.serve(router))
                ctx = zmq.asyncio.Context()
                client = DealerQueue(ctx, router.endpoint)
                try:
                    for i in range(FLOOD):
                        await client.send(Submit(f"r{i}", (5, 6, 7, 8), {}, MAX_TOKENS, (), None))
                    finals, tokens = await answers(client, FLOOD)
                    refused = [rid for rid, f in finals.items() if f.code == ErrorCode.QUEUE_FULL]
                    served = [rid for rid, f in finals.items() if f.finish_reason == FinishReason.LENGTH]
                    assert sorted(refused + served) == sorted(finals), finals
                    assert max(waiting) <= MAX_WAITING and len(served) >= LANES + MAX_WAITING
                    assert refused and all(http_status(finals[r].code or "") == 429 for r in refused)
                    assert all("queue full" in (finals[r].error or "") for r in refused)
                    assert all(tokens[r] == MAX_TOKENS for r in served)
                    registry = driver.telemetry.registry
                    assert registry.get_sample_value("skippy_driver_waiting_refused_total") == len(refused)

                    await client.send(Submit("after", (5, 6, 7, 8), {}, 4, (), None))
                    finals, tokens = await answers(client, 1)
                    assert (finals["after"].finish_reason, tokens["after"]) == (FinishReason.LENGTH, 4)
                    started, ended = events("waiting_full"), events("waiting_full_ended")
                    assert 1 <= len(started) == len(ended) < len(refused)  # one line per episode, not per request
                    assert sum(e["refused"] for e in ended) == len(refused)
                    assert not events("request_refused")  # nor a line per refused request elsewhere
                finally:
                    serving.cancel()
                    await asyncio.gather(serving, *endpoint.senders, return_exceptions=True)
                    client.close()
                    ctx.term()
                    router.close()
                    sinks.close(linger_ms=0)

    run(body())


async def answers(client: DealerQueue, n: int) -> tuple[dict[str, TokenEvents], Counter[str]]:
    """The final events of `n` requests (by request id) and the tokens each got before it."""
    finals: dict[str, TokenEvents] = {}
    tokens: Counter[str] = Counter()
    while len(finals) < n:
        msg = await asyncio.wait_for(client.recv(), WAIT_S)
        assert isinstance(msg, TokenEvents | EventBatch), msg
        for event in events_of(msg):
            tokens[event.request_id] += len(event.tokens)
            if event.finish_reason is not None:
                finals[event.request_id] = event
    return finals, tokens
