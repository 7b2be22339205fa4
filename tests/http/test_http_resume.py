"""The adapter's resuming (skippy.adapter.resume) on the real adapter over a fake broker (adapter_helpers):
a generation lost after its first tokens (`pipeline_lost`: its stage 0 or the broker died) resumes from
the tokens already streamed and the client gets every token once, in one stream and one usage count, through
the official SDK; a client that leaves a resumed stream has the resumed submission cancelled as abandoned; a
request that finds no pipeline ready waits for one instead of a 503; a request lost for good (no pipeline ready
within the deadline) fails with one error naming the loss."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from adapter_helpers import TOKENS, adapter_server

pytestmark = pytest.mark.anyio
ASK = [{"role": "user", "content": "hi"}]


async def test_a_lost_generation_resumes_from_its_tokens(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0) as oai:
            whole = await oai.chat.completions.create(model="tiny", messages=ASK, max_tokens=3)  # undisturbed
            broker.lose_after = 2
            chunks = [c async for c in await oai.chat.completions.create(
                model="tiny", messages=ASK, max_tokens=3, stream=True, stream_options={"include_usage": True})]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # each token once, in order
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == len(TOKENS)
    assert broker.histories[-2:] == [(), TOKENS[:2]]  # the lost submission, then its resumed one with 2 tokens


async def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "not within 30 s"
        await asyncio.sleep(0.01)  # a bounded poll's interval


async def test_leaving_a_resumed_stream_cancels_the_resumed_submission(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0) as oai:
            broker.lose_after, broker.hold_resumed = 1, True
            stream = await oai.chat.completions.create(model="tiny", messages=ASK, max_tokens=3, stream=True)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    break  # the token before the loss
            await until(lambda: broker.submitted == 2)  # lost, and resumed (it runs on, silent)
            await stream.close()  # the client leaves
            await until(lambda: broker.abandoned == 1)
    lost, resumed = broker.cancels[0], broker.cancels[-1]
    assert resumed == f"{lost}-r1" and broker.cancelled == 2, broker.cancels  # the lost one, then the resumed one


async def test_a_request_waits_for_a_pipeline_instead_of_a_503(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        broker.not_ready = 3
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0) as oai:
            reply = await oai.chat.completions.create(model="tiny", messages=ASK, max_tokens=3)
    assert reply.choices[0].finish_reason == "length" and broker.not_ready == 0 and broker.submitted == 1


async def test_a_generation_lost_for_good_fails_once_naming_it(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama"), resume_timeout_s=0.5) as (server, broker):
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0) as oai:
            broker.lose_after, broker.not_ready_after_loss = 1, 1000
            stream = await oai.chat.completions.create(model="tiny", messages=ASK, max_tokens=3, stream=True)
            with pytest.raises(openai.APIError) as failed:
                async for _ in stream:
                    pass
    assert failed.value.code == "pipeline_failed"
    assert "stage 0 at ipc://x lost its connection; no pipeline took it back within 0.5 s" in failed.value.message
    assert broker.submitted == 1
