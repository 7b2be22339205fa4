"""The broker in front of a real tiny-model pipeline (both stages are processes, stage 0 included).

- overload: concurrency 2, queue capacity 2, six simultaneous requests -> two run, two queue and
  complete after a running one has finished, two are refused with queue_full; the output equals
  what stage 0 gives directly, and a PipelineClient pointed at the broker works unchanged;
- admission timeout 0.2 s: the queued requests are refused with admission_timeout;
- cancel of a queued and of a running request; Status reflects running / waiting throughout;
- a client with its own event endpoint gets every event straight from stage 0 (skippy.driver.direct_events);
  the next client bound there (a restarted adapter) cancels the requests its predecessor left running;
- SIGKILL of stage 1: in-flight requests end with pipeline_failed naming the stage, the broker
  turns not-ready naming it, new requests are refused with unavailable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import zmq.asyncio
from broker_helpers import WAIT_S, BrokerClient, PipelineProcs, Stream, run, running_broker

from skippy.client import PipelineClient
from skippy.config import AdmissionOptions

LONG = 480  # tokens: >= 2.4 s at the 5 ms wire delay, so these outlast every wait below; cancelled at the end
ADMISSION = AdmissionOptions(generation_concurrency=2, queue_capacity=2)


async def cancel_all(client: BrokerClient, streams: list[Stream]) -> None:
    for stream in streams:
        if not stream.done.is_set():
            await client.cancel(stream.request_id)
    await asyncio.wait_for(asyncio.gather(*(s.finished() for s in streams)), WAIT_S)


def test_overload_runs_two_queues_two_refuses_two(shared_pipeline: PipelineProcs) -> None:
    async def body() -> None:
        async with running_broker([shared_pipeline.request_endpoint], ADMISSION) as (broker, client):
            streams = [await client.submit((5, 6, 7, 8 + i), max_tokens=40) for i in range(6)]
            finals = await asyncio.wait_for(asyncio.gather(*(s.finished() for s in streams)), WAIT_S)
            for stream, final in zip(streams[:4], finals[:4]):
                assert (final.finish_reason, final.error, len(stream.tokens)) == ("length", None, 40), final
            for stream, final in zip(streams[4:], finals[4:]):
                assert (final.finish_reason, final.code, stream.tokens) == ("error", "queue_full", []), final
                assert final.error == "generation queue full (capacity 2); retry later"
            first_done = min(s.final_at for s in streams[:2] if s.final_at is not None)
            assert all(s.first_token_at is not None and s.first_token_at > first_done for s in streams[2:4])
            status = await client.status()
            assert (status.ready, status.running, status.waiting, status.lane_count) == (True, 0, 0, 2)
            assert dict(broker.outcomes) == {"length": 4, "queue_full": 2}

            direct = PipelineClient(shared_pipeline.request_endpoint)  # the same prompt straight to stage 0
            via = PipelineClient(broker.endpoint)  # and a PipelineClient against the broker: same protocol
            try:
                assert (await via.status()).ready
                expected, _ = await (await direct.submit([5, 6, 7, 8], max_tokens=40)).collect()
                tokens, final = await (await via.submit([5, 6, 7, 8], max_tokens=40)).collect()
                assert final.finish_reason == "length" and tokens == expected == streams[0].tokens
            finally:
                direct.close()
                via.close()

    run(body())


def test_queued_requests_time_out(shared_pipeline: PipelineProcs) -> None:
    admission = AdmissionOptions(generation_concurrency=2, queue_capacity=2, admission_timeout_secs=0.2)

    async def body() -> None:
        async with running_broker([shared_pipeline.request_endpoint], admission) as (_broker, client):
            running = [await client.submit(max_tokens=LONG) for _ in range(2)]
            queued = [await client.submit(max_tokens=40) for _ in range(2)]
            for stream in queued:
                final = await stream.finished(timeout_s=5.0)
                assert (final.finish_reason, final.code) == ("error", "admission_timeout"), final
                assert final.error == "waited 0.2 s for a generation slot"
            assert not any(s.done.is_set() for s in running)
            status = await client.status()
            assert (status.running, status.waiting) == (2, 0)
            await cancel_all(client, running)

    run(body())


def test_cancel_queued_and_running_requests(shared_pipeline: PipelineProcs) -> None:
    async def body() -> None:
        async with running_broker([shared_pipeline.request_endpoint], ADMISSION) as (_broker, client):
            running = [await client.submit(max_tokens=LONG) for _ in range(2)]
            queued = [await client.submit(max_tokens=LONG) for _ in range(2)]
            await asyncio.gather(*(s.decoding() for s in running))
            status = await client.status()
            assert (status.ready, status.running, status.waiting, status.lane_count, status.ctx_size) == (
                True, 2, 2, 2, 512)

            await client.cancel(queued[0].request_id)
            final = await queued[0].finished()
            assert (final.finish_reason, queued[0].tokens) == ("cancelled", [])
            assert ((await client.status()).running, (await client.status()).waiting) == (2, 1)

            await client.cancel(running[0].request_id)
            final = await running[0].finished()
            assert final.finish_reason == "cancelled" and 0 < len(running[0].tokens) < LONG
            await queued[1].decoding()  # the freed permit went to the remaining queued request
            status = await client.status()
            assert (status.running, status.waiting) == (2, 0)
            await cancel_all(client, [running[1], queued[1]])
            status = await client.status()
            assert (status.running, status.waiting) == (0, 0)

    run(body())


def test_killed_stage_fails_requests_and_turns_the_broker_unavailable(
        make_pipeline: Callable[..., PipelineProcs]) -> None:
    """A later stage that never comes back: the requests in flight pause, then fail at the resume deadline
    naming it, and the broker turns unavailable."""
    pipe = make_pipeline("--openai-resume-timeout-s", "2")

    async def body() -> None:
        async with running_broker([pipe.request_endpoint]) as (broker, client):
            streams = [await client.submit(max_tokens=LONG) for _ in range(2)]
            await asyncio.gather(*(s.decoding() for s in streams))
            pipe.stages.kill("stage1")
            for stream in streams:
                final = await stream.finished(timeout_s=10.0)
                assert (final.finish_reason, final.code) == ("error", "pipeline_failed"), final
                assert final.error is not None and "stage1" in final.error
            await broker.wait_until(lambda: not broker.ready, 5.0)
            status = await client.status()
            assert (status.ready, status.dead_stage, status.running, status.lane_count) == (False, "stage1", 0, 0)
            refused = await (await client.submit()).finished()
            assert (refused.finish_reason, refused.code) == ("error", "unavailable")
            assert refused.error == "pipeline unavailable: stage stage1 is down"

    run(body())


def test_an_adapter_on_the_host_gets_its_events_straight_from_stage_0(shared_pipeline: PipelineProcs,
                                                                      tmp_path: Path) -> None:
    """With `events_endpoint`, stage 0 pushes every event (final included) to the client itself, through an
    ipc broker or with none between; the output equals the relayed one, the copy of the final event the
    submitter gets is not delivered twice, and a cancel's final event comes the same way."""
    async def body() -> None:
        async with running_broker([shared_pipeline.request_endpoint], ADMISSION,
                                  bind=f"ipc://{tmp_path}/broker.sock") as (broker, _client):
            relayed = PipelineClient(broker.endpoint)
            via_broker = PipelineClient(broker.endpoint, events_endpoint=f"ipc://{tmp_path}/a.sock")
            no_broker = PipelineClient(shared_pipeline.request_endpoint, events_endpoint=f"ipc://{tmp_path}/b.sock")
            try:
                expected, _ = await (await relayed.submit([5, 6, 7, 8], max_tokens=40)).collect()
                assert relayed.direct_events == 0
                for client in (via_broker, no_broker):
                    tokens, final = await (await client.submit([5, 6, 7, 8], max_tokens=40)).collect()
                    assert (tokens, final.finish_reason) == (expected, "length")
                    assert 1 <= client.direct_events <= 40  # a message per step at most, the final in the last
                handle = await via_broker.submit([5, 6, 7, 8], max_tokens=LONG)
                events = aiter(handle)
                first = await anext(events)
                assert first.tokens
                await via_broker.cancel(handle.request_id)
                rest = [event async for event in events]
                assert rest[-1].finish_reason == "cancelled" and len(rest) < LONG
                await broker.wait_until(lambda: not broker.requests, WAIT_S)  # its copy may come after ours
                assert dict(broker.outcomes) == {"length": 2, "cancelled": 1}
                assert (await via_broker.status()).running == 0
            finally:
                for client in (relayed, via_broker, no_broker):
                    client.close()

    run(body())


def test_the_client_bound_after_a_dead_one_on_its_events_endpoint_cancels_its_requests(
        shared_pipeline: PipelineProcs, tmp_path: Path) -> None:
    """An adapter killed mid-stream leaves its requests generating; the one restarted on the same events endpoint
    gets their events and cancels them, and the broker takes that cancel because it names where their events
    go. A client that names nothing, or another endpoint, cannot cancel another client's request."""
    async def body() -> None:
        async with running_broker([shared_pipeline.request_endpoint], ADMISSION,
                                  bind=f"ipc://{tmp_path}/broker.sock") as (broker, stranger):
            endpoint = f"ipc://{tmp_path}/events.sock"
            first = PipelineClient(broker.endpoint, events_endpoint=endpoint)
            handle = await first.submit([5, 6, 7, 8], max_tokens=LONG)
            events = aiter(handle)
            assert (await anext(events)).tokens
            await stranger.cancel(handle.request_id)
            await stranger.cancel(handle.request_id, events_to=f"ipc://{tmp_path}/elsewhere.sock")
            await stranger.status()  # answered after both cancels: one client's messages are handled in order
            more = [await anext(events) for _ in range(8)]
            assert all(e.tokens and e.finish_reason is None for e in more), more
            first.close()  # gone without a cancel: its request runs on, nobody reading its events
            heir = PipelineClient(broker.endpoint, events_endpoint=endpoint)
            try:
                await broker.wait_until(lambda: not broker.requests, WAIT_S)
                assert dict(broker.outcomes) == {"cancelled": 1}
                assert heir.orphans_cancelled == 1 and heir.direct_events < LONG
                assert (await heir.status()).running == 0
            finally:
                heir.close()

    run(body())


def test_an_events_endpoint_stage_0_cannot_reach_falls_back_to_the_submitter(shared_pipeline: PipelineProcs) -> None:
    """`events_to` that ZeroMQ refuses to connect to: stage 0 logs it and sends every event to the submitter."""
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        client = BrokerClient(shared_pipeline.request_endpoint, ctx)
        try:
            stream = await client.submit(max_tokens=8, events_to="ipc://")
            final = await stream.finished()
            assert (final.finish_reason, len(stream.tokens)) == ("length", 8)
            assert final.sent_direct is None
        finally:
            client.close()
            ctx.term()

    run(body())
