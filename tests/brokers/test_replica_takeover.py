"""Two replicas behind one broker: a request whose replica's stage 0 dies moves to the other, with its tokens.

Two real pipelines (stage 0 a process too) behind one broker; the adapter's resuming
(skippy.adapter.resume.ResumingClient) over a PipelineClient to the broker, as the adapter runs it. Stage 0 of the
replica holding a stream is SIGKILLed mid-stream and not restarted: the broker ends its requests with
pipeline_lost, the resumed request goes to the replica still ready, and every stream completes with the tokens of
an undisturbed run of the same greedy requests, each token once (the replicas run `deterministic`: bitwise
equality needs rows whose results do not depend on their cells or batch company, docs/deterministic.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from broker_helpers import WAIT_S, PipelineProcs, run, running_broker

from skippy.adapter.resume import ResumingClient
from skippy.client import PipelineClient
from skippy.protocol import TokenEvents

MAX_TOKENS = 120
PROMPTS = [[5, 6, 7, 8 + i] for i in range(2)]


async def _collect(events: AsyncIterator[TokenEvents], started: asyncio.Event) -> tuple[list[int], TokenEvents]:
    tokens: list[int] = []
    async for event in events:
        if event.final:
            return tokens, event
        tokens += event.tokens
        if len(tokens) >= 5:
            started.set()
    raise AssertionError("no final event")


async def _generate(resuming: ResumingClient, prefix: str,
                    on_started: Callable[[], None] | None = None) -> list[tuple[list[int], TokenEvents]]:
    started = [asyncio.Event() for _ in PROMPTS]
    runs = [asyncio.create_task(_collect(await resuming.submit(p, None, MAX_TOKENS, frozenset(), f"{prefix}{i}"), s))
            for i, (p, s) in enumerate(zip(PROMPTS, started))]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), WAIT_S)
    if on_started is not None:
        on_started()
    return await asyncio.wait_for(asyncio.gather(*runs), WAIT_S)


def test_a_request_whose_replica_died_moves_to_the_other(make_pipeline: Callable[..., PipelineProcs]) -> None:
    # deterministic: the moved stream's KV lands in other cells beside other rows, which llama.cpp otherwise rounds
    replicas = [make_pipeline(deterministic=True), make_pipeline(deterministic=True)]

    async def body() -> None:
        async with running_broker([r.request_endpoint for r in replicas]) as (broker, _):
            client = PipelineClient(broker.endpoint)
            resuming = ResumingClient(client, resume_timeout_s=WAIT_S)
            killed: list[str] = []

            def kill_a_holder() -> None:  # stage 0 of the replica holding the first stream
                link = broker.requests["moved0"].link
                assert link is not None
                (victim,) = [r for r in replicas if r.request_endpoint == link.endpoint]
                victim.stages.kill("stage0")
                killed.append(link.endpoint)

            try:
                undisturbed = await _generate(resuming, "calm")
                moved = await _generate(resuming, "moved", kill_a_holder)
            finally:
                client.close()
            for (want, calm_final), (got, final) in zip(undisturbed, moved):
                assert calm_final.finish_reason == final.finish_reason == "length", final
                assert got == want  # the undisturbed tokens, each once
            assert len(killed) == 1
            survivor = next(r.request_endpoint for r in replicas if r.request_endpoint not in killed)
            assert {req.link.endpoint for req in broker.requests.values() if req.link is not None} <= {survivor}
            assert broker.outcomes["pipeline_lost"] >= 1

    run(body())
