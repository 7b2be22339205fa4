"""Stage 0's request endpoint sends a step's events as one message per destination, one event per request.

A scripted stage 0 (the endpoint's `Stage0`, with handles the test fills) stands in for the driver, as in
test_direct_events_bound; the ROUTER, the event sockets and the codec are real. What the driver delivers in one
step (several events of one request: a window's tokens, then its finish; and events of several requests) leaves
as one message toward each client: an EventBatch with one TokenEvents per request, its tokens in order, the
final fields on it. A client then reads back through `PipelineClient`'s own parsing the same tokens as before.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from scripted_stage0 import ScriptedStage0

from skippy.driver.direct_events import EventSinks
from skippy.driver.requests import RequestEndpoint
from skippy.protocol import EventBatch, FinishReason, Submit, TokenEvents, decode
from skippy.request_events import merge_events, split_final
from skippy.transport.queues import DealerQueue, RouterQueue

WAIT_S = 15.0


class Log:
    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: None


def step(stage0: ScriptedStage0, rid: str, tokens: tuple[int, ...], finish: FinishReason | None = None) -> None:
    """What the driver delivers for one request in one step: a token event per token (as a verify window's
    accepted drafts may), then its final event."""
    for token in tokens:
        stage0.handles[rid].put(TokenEvents(rid, (token,), draws=token))
    if finish is not None:
        stage0.handles[rid].put(TokenEvents(rid, (), finish))


def test_one_message_per_step_and_destination(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        stage0, sinks = ScriptedStage0(), EventSinks()
        endpoint = RequestEndpoint(stage0, sinks, Log())
        router = RouterQueue(ctx, f"ipc://{tmp_path}/req.sock")
        serving = asyncio.get_running_loop().create_task(endpoint.serve(router))
        events_at = f"ipc://{tmp_path}/events.sock"
        pull = ctx.socket(zmq.PULL)
        pull.bind(events_at)
        submitter = DealerQueue(ctx, router.endpoint)
        try:
            for rid, to in (("a", events_at), ("b", events_at), ("c", None), ("d", None)):
                await submitter.send(Submit(rid, (1, 2), {}, 100, (), to))
                assert await asyncio.wait_for(stage0.submitted.get(), WAIT_S) == rid
            step(stage0, "a", (10, 11, 12))
            step(stage0, "b", (20,))
            step(stage0, "c", (30, 31), FinishReason.LENGTH)
            step(stage0, "d", (40,))
            direct = decode(await asyncio.wait_for(pull.recv_multipart(copy=False), WAIT_S))
            assert isinstance(direct, EventBatch)
            assert [(e.request_id, e.tokens, e.draws) for e in direct.events] == [("a", (10, 11, 12), 12), ("b", (20,), 20)]
            relayed = await asyncio.wait_for(submitter.recv(), WAIT_S)
            assert isinstance(relayed, EventBatch)
            (c, d) = relayed.events
            assert (c.request_id, c.tokens, c.finish_reason) == ("c", (30, 31), FinishReason.LENGTH)
            assert (d.request_id, d.tokens, d.finish_reason) == ("d", (40,), None)

            step(stage0, "b", (21,), FinishReason.STOP)  # a lone event travels as itself; its final copy follows
            alone = decode(await asyncio.wait_for(pull.recv_multipart(copy=False), WAIT_S))
            assert isinstance(alone, TokenEvents) and (alone.tokens, alone.finish_reason) == ((21,), FinishReason.STOP)
            copy = await asyncio.wait_for(submitter.recv(), WAIT_S)
            assert (copy.request_id, copy.tokens, copy.sent_direct) == ("b", (), 2)
        finally:
            tasks = [serving, *endpoint.senders]  # "a" and "d" are still open
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            submitter.close()
            router.close()
            pull.close(linger=0)
            sinks.close(linger_ms=0)
            ctx.term()

    asyncio.run(asyncio.wait_for(body(), 60.0))


def test_merged_events_keep_what_resuming_needs() -> None:
    progress_then_tokens = [TokenEvents("r", (), progress=None), TokenEvents("r", (5, 6), draws=4, chunk_ends=(2,)),
                            TokenEvents("r", (7,), draws=5), TokenEvents("r", (), FinishReason.STOP)]
    merged = merge_events(progress_then_tokens)
    assert (merged.tokens, merged.draws, merged.chunk_ends, merged.finish_reason) == ((5, 6, 7), 5, (2,), "stop")
    tokens, final = split_final(merged)
    assert (tokens.tokens, tokens.final, tokens.draws, tokens.chunk_ends) == ((5, 6, 7), False, 5, (2,))
    assert (final.tokens, final.finish_reason) == ((), "stop")
    assert split_final(tokens) == (tokens,)
