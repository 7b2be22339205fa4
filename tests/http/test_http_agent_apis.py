"""The agent APIs' edges with the official async SDKs on the real adapter over a fake broker (tests/http's
adapter_helpers): a generation that fails after its first token (the Responses stream ends with
`response.failed`, its `error` saying why, the Anthropic stream with an `error` event the SDK raises, and
responses not streamed are a 502 in each API's envelope); `x-api-key` as Anthropic's SDK sends the key, and
its beta client's `/v1/messages?beta=true` (Claude Code's);
what a request without a token limit may generate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest
from adapter_helpers import adapter_server
from structlog.testing import capture_logs

pytestmark = pytest.mark.anyio
ASK = [{"role": "user", "content": "hi"}]


async def test_a_failure_mid_stream_ends_each_api_with_its_error(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        broker.fail_after = 1
        base = f"http://127.0.0.1:{server.port}"
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as oai:
            events = [e async for e in await oai.responses.create(model="tiny", input="hi", stream=True)]
            assert [e.type for e in events[:3]] == ["response.created", "response.in_progress", "response.output_item.added"]
            failed = events[-1]
            assert failed.type == "response.failed" and failed.response.status == "failed"
            assert failed.response.error and "stage 1 at ipc://x lost" in failed.response.error.message
            async with oai.responses.stream(model="tiny", input="hi") as stream:
                assert [e.type async for e in stream][-1] == "response.failed"
                with pytest.raises(RuntimeError, match="response.completed"):
                    await stream.get_final_response()
            with pytest.raises(openai.APIStatusError) as whole:
                await oai.responses.create(model="tiny", input="hi")
            assert whole.value.status_code == 502 and whole.value.code == "pipeline_failed"
        async with anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=0) as claude:
            with pytest.raises(anthropic.APIStatusError) as streamed:
                async with claude.messages.stream(model="tiny", max_tokens=8, messages=ASK) as stream:
                    async for _ in stream:
                        pass
            assert streamed.value.body == {"type": "error", "error": {
                "type": "api_error", "message": "stage 1 at ipc://x lost"}}
            with pytest.raises(anthropic.InternalServerError) as whole_message:
                await claude.messages.create(model="tiny", max_tokens=8, messages=ASK)
            assert whole_message.value.status_code == 502
            assert whole_message.value.body == streamed.value.body


async def test_the_anthropic_sdk_passes_the_key_as_x_api_key(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama"), api_key="sk-anthropic-key") as (server, broker):
        base = f"http://127.0.0.1:{server.port}"
        async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-anthropic-key", max_retries=0) as claude:
            reply = await claude.messages.create(model="tiny", max_tokens=8, messages=ASK)
            assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3
            assert (await claude.messages.count_tokens(model="tiny", messages=ASK)).input_tokens > 0
            beta = await claude.beta.messages.create(model="tiny", max_tokens=8, messages=ASK)  # ?beta=true, as Claude Code
            assert beta.stop_reason == "max_tokens"
        async with anthropic.AsyncAnthropic(base_url=base, api_key="wrong", max_retries=0) as wrong:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await wrong.messages.create(model="tiny", max_tokens=8, messages=ASK)
            body: object = refused.value.body
            assert isinstance(body, dict) and body["error"]["type"] == "authentication_error"
        assert broker.submitted == 2


async def test_a_response_without_max_output_tokens_may_fill_the_context(tiny_model: Callable[..., Path]) -> None:
    """OpenAI's Responses default (and Codex's requests, which send no limit): up to what the context leaves,
    not the adapter's default max tokens (8 here), which chat keeps; Anthropic's max_tokens is clamped to it."""
    async with adapter_server(tiny_model("llama")) as (server, broker):
        base = f"http://127.0.0.1:{server.port}"
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as oai:
            count = (await oai.responses.input_tokens.count(input="hi")).input_tokens
            await oai.responses.create(model="tiny", input="hi")
            assert broker.max_tokens == 256 - count  # the fake broker's context: 256
            await oai.chat.completions.create(model="tiny", messages=ASK)
            assert broker.max_tokens == 8
        async with anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=0) as claude:
            async for _ in await claude.messages.create(model="tiny", max_tokens=32000, messages=ASK, stream=True):
                pass
            assert broker.max_tokens == 256 - (await claude.messages.count_tokens(model="tiny", messages=ASK)).input_tokens


async def test_anthropic_model_names_are_served_by_the_one_model(tiny_model: Callable[..., Path]) -> None:
    """Claude Code names Anthropic's models (its main one, its small fast one) unless told otherwise: the Messages
    route answers them with the served model, and says so in its log once per name; the OpenAI routes keep 404."""
    async with adapter_server(tiny_model("llama")) as (server, broker):
        base = f"http://127.0.0.1:{server.port}"
        with capture_logs() as logs:
            async with anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=0) as claude:
                for name in ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-sonnet-4-5"):
                    reply = await claude.messages.create(model=name, max_tokens=8, messages=ASK)
                    assert reply.stop_reason == "max_tokens" and reply.model == "tiny"
                assert (await claude.messages.count_tokens(model="claude-opus-4-1", messages=ASK)).input_tokens > 0
        substituted = [(e["asked"], e["served"]) for e in logs if e["event"] == "model_substituted"]
        assert substituted == [("claude-sonnet-4-5", "tiny"), ("claude-haiku-4-5", "tiny"), ("claude-opus-4-1", "tiny")]
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as oai:
            with pytest.raises(openai.NotFoundError):
                await oai.chat.completions.create(model="claude-sonnet-4-5", messages=ASK, max_tokens=8)  # type: ignore[arg-type]
        assert broker.submitted == 3
