"""The broker against scripted fake stage 0s: relaying, routing, silence, refusals, shutdown.

A `FakeStage0` answers Status as the test sets it and records Submits; the test plays the
pipeline by sending TokenEvents, so what a real pipeline does not do on demand (codeless errors,
logprobs, going silent) is exercised in well under a second per case (silence: the broker's clock is
moved past its 2 s status timeout by the test, not waited for).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq.asyncio
from broker_helpers import WAIT_S, BrokerClient, Clock, FakeStage0, run, running_broker

from skippy.config import AdmissionOptions
from skippy.driver.direct_events import submitter_copy
from skippy.protocol import TokenEvents, TokenLogprob
from skippy.protocol.base import MAX_CONTEXT_TOKENS


def fakes(ctx: zmq.asyncio.Context, directory: Path, n: int, **kwargs: int) -> list[FakeStage0]:
    return [FakeStage0(ctx, f"ipc://{directory}/fake{i}.req", **kwargs) for i in range(n)]


def test_events_are_relayed_whole_and_codeless_errors_become_pipeline_failed(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        (stage0,) = fakes(ctx, tmp_path, 1, lane_count=4)
        try:
            async with running_broker([stage0.endpoint]) as (broker, client):
                ok, bad, coded = [await client.submit(request_id=rid) for rid in ("ok", "bad", "coded")]
                routed = [await stage0.next_submit() for _ in range(3)]
                assert [submit.request_id for _, submit in routed] == ["ok", "bad", "coded"]
                peer, submit = routed[0]
                assert (submit.prompt, submit.max_tokens) == ((5, 6, 7, 8), 40)
                logprob = TokenLogprob(9, -0.25, ((9, -0.25), (3, -2.0)))
                tokens = TokenEvents("ok", (9,), None, None, None, (logprob,))
                final = TokenEvents("ok", (10,), "stop", None, None, (TokenLogprob(10, -0.5),))
                for msg in (tokens, final):
                    await stage0.send(peer, msg)
                await ok.finished()
                assert ok.messages == [tokens, final]  # every field, logprobs included, unchanged
                await stage0.send(peer, TokenEvents("bad", (), "error", "stage stage1: stage stage1 stopped"))
                await stage0.send(peer, TokenEvents("coded", (), "error", "prompt too long", "bad_request"))
                assert (await bad.finished()) == TokenEvents("bad", (), "error", "stage stage1: stage stage1 stopped",
                                                             "pipeline_failed")
                assert (await coded.finished()).code == "bad_request"
                assert dict(broker.outcomes) == {"stop": 1, "pipeline_failed": 1, "bad_request": 1}
        finally:
            stage0.close()
            ctx.term()

    run(body())


def test_requests_go_to_the_least_loaded_ready_pipeline(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        first, second = fakes(ctx, tmp_path, 2)
        second.ctx_size = 256
        try:
            async with running_broker([first.endpoint, second.endpoint]) as (broker, client):
                await broker.wait_until(lambda: broker.status().lane_count == 4, WAIT_S)
                status = await client.status()
                assert (status.ready, status.dead_stage, status.lane_count, status.ctx_size) == (True, None, 4, 256)
                assert broker.queue.capacity == 32  # clamp(8 x 4, 16, 256)
                for _ in range(4):
                    await client.submit(max_tokens=8)
                # two each: waiting for a third on either would time out the test
                await asyncio.wait_for(asyncio.gather(*(f.next_submit() for f in (first, second, first, second))),
                                       WAIT_S)
                assert first.submits.empty() and second.submits.empty()
                too_long = await (await client.submit(prompt=range(3, 300))).finished()
                assert (too_long.code, too_long.error) == (
                    "context_length_exceeded", "This model's maximum context length is 256 tokens. However, your prompt"
                    " resulted in 297 tokens (at most 255, to leave one for the reply). Please reduce the length of"
                    " the prompt.")

                second.ready, second.dead_stage = False, "stage2"
                await broker.wait_until(lambda: broker.status().lane_count == 2, WAIT_S)
                status = await client.status()
                assert (status.ready, status.dead_stage, status.running, status.ctx_size) == (True, "stage2", 4, 512)
        finally:
            first.close()
            second.close()
            ctx.term()

    run(body())


def test_silent_stage0_fails_its_requests_after_the_status_timeout(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        (stage0,) = fakes(ctx, tmp_path, 1)
        clock = Clock(1000.0)
        try:
            async with running_broker([stage0.endpoint], stage0_ids=["stage0"], clock=clock,
                                      poll_interval_s=0.05) as (broker, client):
                (link,) = broker.pool.links
                stream = await client.submit(request_id="stranded")
                await stage0.next_submit()
                stage0.silent = True
                await asyncio.wait_for(stage0.ignored.wait(), WAIT_S)  # every earlier poll was answered...
                await broker.wait_until(lambda: link.status is not None and link.status.nonce == stage0.answered,
                                        WAIT_S)  # ...and the broker has read those answers
                clock.now += 1.5  # silent, but within the 2 s status timeout: still ready, nothing failed
                assert link.answering() and broker.ready and not stream.done.is_set()
                clock.now += 1.0  # 2.5 s without a Status: the next poll finds stage 0 silent
                assert not link.answering()
                final = await stream.finished()
                assert (final.finish_reason, final.code) == ("error", "pipeline_lost")  # its client may resume it
                assert final.error == f"stage 0 at {stage0.endpoint} not answering (no status for 2 s)"
                status = await client.status()
                assert (status.ready, status.dead_stage, status.running) == (False, "stage0", 0)
                refused = await (await client.submit()).finished()
                assert (refused.code, refused.error) == ("unavailable", f"stage 0 at {stage0.endpoint} not answering")
                stage0.silent = False  # back: the broker (on a fresh socket) sees it and routes again
                await broker.wait_until(lambda: broker.ready, WAIT_S)
                assert await stage0.next_cancel() == "stranded"  # told to drop the request it may still be running
                await client.submit(request_id="after")
                assert (await stage0.next_submit())[1].request_id == "after"
        finally:
            stage0.close()
            ctx.term()

    run(body())


def test_refusals_duplicates_shutdown_and_losing_the_last_pipeline(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        (stage0,) = fakes(ctx, tmp_path, 1, lane_count=1)
        try:
            async with running_broker([stage0.endpoint], AdmissionOptions(queue_capacity=4)) as (broker, client):
                running = await client.submit(request_id="running")
                await stage0.next_submit()
                other = BrokerClient(broker.endpoint, ctx)  # a second adapter picking the same request id
                try:
                    duplicate = await (await other.submit(request_id="running")).finished()
                finally:
                    other.close()
                assert (duplicate.code, duplicate.error) == ("bad_request", "request id running is already in flight")
                queued = [await client.submit(request_id=f"q{i}") for i in range(2)]
                await broker.wait_until(lambda: broker.queue.waiting == 2, WAIT_S)
                stage0.ready, stage0.dead_stage = False, "stage1"  # the only pipeline goes: queued ones are refused
                for stream in queued:
                    final = await stream.finished()
                    assert (final.code, final.error) == ("unavailable", "pipeline unavailable: stage stage1 is down")
                stage0.ready, stage0.dead_stage = True, None
                await broker.wait_until(lambda: broker.ready, WAIT_S)
                late = await client.submit(request_id="late")
                await broker.wait_until(lambda: broker.queue.waiting == 1, WAIT_S)
                await broker.close()
                for stream in (running, late):
                    final = await stream.finished()
                    assert (final.code, final.error) == ("unavailable", "broker stopping")
                assert await stage0.next_cancel() == "running"  # the running request is cancelled at stage 0
                assert dict(broker.outcomes) == {"bad_request": 1, "unavailable": 4}
        finally:
            stage0.close()
            ctx.term()

    run(body())


def test_adaptive_admission_starts_at_its_minimum(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        (stage0,) = fakes(ctx, tmp_path, 1, lane_count=4)
        try:
            admission = AdmissionOptions(adaptive=True, adaptive_min_concurrency=1)
            async with running_broker([stage0.endpoint], admission) as (broker, client):
                assert broker.adaptive is not None and broker.adaptive.max_concurrency == 4
                first, second = await client.submit(request_id="first"), await client.submit(request_id="second")
                peer, _ = await stage0.next_submit()
                await broker.wait_until(lambda: broker.queue.waiting == 1, WAIT_S)
                status = await client.status()
                assert (status.lane_count, status.running, status.waiting) == (4, 1, 1)  # 4 allowed, 1 granted so far
                await stage0.send(peer, TokenEvents("first", (7,), "length"))
                assert (await first.finished()).finish_reason == "length"
                assert (await stage0.next_submit())[1].request_id == "second"  # its permit passed on
                await client.cancel("second")
                assert await stage0.next_cancel() == "second"
                await stage0.send(peer, TokenEvents("second", (), "cancelled"))
                assert (await second.finished()).finish_reason == "cancelled"
        finally:
            stage0.close()
            ctx.term()

    run(body())


def test_events_go_direct_only_when_adapter_broker_and_stage_0_share_a_host(tmp_path: Path) -> None:
    """Broker and stage 0 both on ipc: `events_to` reaches stage 0, and stage 0's marked copy of the final
    event frees the permit without reaching the client (which has the original). A broker on tcp
    (adapters may be elsewhere) clears `events_to`; events then take the relay."""
    events_to = f"ipc://{tmp_path}/events.sock"

    async def body() -> None:
        ctx = zmq.asyncio.Context()
        (stage0,) = fakes(ctx, tmp_path, 1)
        try:
            async with running_broker([stage0.endpoint], bind=f"ipc://{tmp_path}/broker.sock") as (broker, client):
                direct = await client.submit(request_id="direct", events_to=events_to)
                peer, submit = await stage0.next_submit()
                assert submit.events_to == events_to
                await stage0.send(peer, submitter_copy(TokenEvents("direct", (), "length"), 40))
                after = await client.submit(request_id="after")  # a relayed request: its events come behind
                peer, submit = await stage0.next_submit()
                assert submit.events_to is None
                await stage0.send(peer, TokenEvents("after", (7,), "stop"))
                await after.finished()
                assert direct.messages == []  # the copy of "direct"'s final event went no further
                assert dict(broker.outcomes) == {"length": 1, "stop": 1}
                assert (await client.status()).running == 0  # both permits free
            async with running_broker([stage0.endpoint]) as (broker, client):
                await client.submit(request_id="remote", events_to=events_to)
                _, submit = await stage0.next_submit()
                assert submit.events_to is None
        finally:
            stage0.close()
            ctx.term()

    run(body())


def test_a_submit_it_cannot_read_is_answered_with_the_reason(tmp_path: Path) -> None:
    """A Submit whose prompt is past the wire's limit is refused by the decoder; its sender still gets a final
    bad_request naming the field (the request id read from the refused header), and stage 0 never sees it."""

    async def body() -> None:
        ctx = zmq.asyncio.Context()
        (stage0,) = fakes(ctx, tmp_path, 1, lane_count=4)
        try:
            async with running_broker([stage0.endpoint]) as (broker, client):
                huge = await client.submit(prompt=(5,) * (MAX_CONTEXT_TOKENS + 1), request_id="huge")
                final = await huge.finished()
                assert (final.finish_reason, final.code) == ("error", "bad_request")
                assert final.error == f"submit.prompt: expected at most {MAX_CONTEXT_TOKENS} items, got {MAX_CONTEXT_TOKENS + 1}"
                ok = await client.submit(request_id="ok")
                peer, submit = await stage0.next_submit()
                assert submit.request_id == "ok"  # the refused one never reached stage 0
                await stage0.send(peer, TokenEvents("ok", (9,), "stop"))
                await ok.finished()
                assert dict(broker.outcomes) == {"bad_request": 1, "stop": 1}
        finally:
            stage0.close()
            ctx.term()

    run(body())
