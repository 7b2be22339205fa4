"""Hostile request bodies at the real adapter (fake broker, real h11 server on port 0, production limits):
JSON nested past the bound, integers past Python's digit limit, numbers past the double range, NaN,
invalid UTF-8, lone surrogates, bodies over the size limit, schema counts that would blow up the grammar,
sampling values out of range. Each gets a 4xx OpenAI envelope saying what is wrong (never a 500),
nothing reaches the broker, and the server keeps serving; `top_p: 0` reaches the sampler as 0."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from adapter_helpers import FakeBroker, adapter_server
from http_helpers import assert_error, rejected, request, roundtrip

from skippy.http.json_body import MAX_DEPTH, JsonBodyError, loads
from skippy.http.server import HttpServer

pytestmark = pytest.mark.anyio
CHAT = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]'


def chat(extra: str) -> bytes:
    return f"{CHAT}, {extra}}}".encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
async def adapter(tiny_model: Callable[..., Path]) -> AsyncIterator[tuple[HttpServer, FakeBroker]]:
    async with adapter_server(tiny_model("llama")) as served:
        yield served


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/v1/chat/completions", nested(100_000).encode(), f"nested deeper than {MAX_DEPTH} levels"),
    ("/v1/chat/completions", chat(f'"metadata": {{"x": {nested(MAX_DEPTH)}}}'), f"nested deeper than {MAX_DEPTH}"),
    ("/tokenize", f'{{"content": {nested(5000)}}}'.encode(), f"nested deeper than {MAX_DEPTH} levels"),
    ("/v1/completions", b'{"model": "tiny", "max_tokens": ' + b"9" * 100_000 + b"}", "an integer has more than 4300"),
    ("/v1/chat/completions", chat('"temperature": NaN'), "NaN is not a JSON value"),
    ("/v1/chat/completions", chat('"seed": -Infinity'), "-Infinity is not a JSON value"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', "not UTF-8 (byte 0xff at offset 29)"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800"}', "lone UTF-16 surrogate (\\ud800)"),
    ("/detokenize", b'{"tokens": [1], "\\udfff": 1}', "lone UTF-16 surrogate (\\udfff)"),
    ("/v1/chat/completions", b'{"model": "tiny", ', "Expecting property name"),
], ids=["deep-100k", "deep-by-one", "deep-tokenize", "digits-100k", "nan", "infinity", "utf-8", "surrogate",
        "surrogate-key", "truncated"])
async def test_hostile_json_is_400_invalid_json_saying_what(adapter: tuple[HttpServer, FakeBroker], path: str,
                                                            body: bytes, message: str) -> None:
    server, broker = adapter
    error = assert_error(await roundtrip(server, request("POST", path, body)), 400, "invalid_json")
    assert error["message"].startswith("invalid JSON body: ") and message in error["message"], error["message"]
    assert broker.submitted == 0
    assert (await roundtrip(server, request("GET", "/health"))).status == 200


@pytest.mark.parametrize(("extra", "param", "message"), [
    ('"temperature": 1e400', "temperature", "expected a finite number, got inf"),
    ('"temperature": ' + "9" * 4000, "temperature", "expected a finite number, got 9999"),
    ('"top_p": 1.5', "top_p", "must be in [0, 1], got 1.5"),
    ('"top_p": -0.5', "top_p", "must be in [0, 1], got -0.5"),
    ('"min_p": 2', "min_p", "must be in [0, 1], got 2"),
    ('"top_k": -1', "top_k", "must be in [0, 2147483647], got -1"),
    ('"top_k": ' + "9" * 4000, "top_k", "must be in [0, 2147483647], got 9999"),
    ('"repeat_penalty": 0', "repeat_penalty", "must be > 0, got 0"),
    ('"repeat_penalty": -1', "repeat_penalty", "must be > 0, got -1"),
    ('"frequency_penalty": 2.5', "frequency_penalty", "must be in [-2, 2], got 2.5"),
    ('"presence_penalty": -3', "presence_penalty", "must be in [-2, 2], got -3"),
    ('"temperature": -0.1', "temperature", "must be in [0, 2], got -0.1"),
    ('"n": 0', "n", "must be in [1, 128], got 0"),
    ('"n": 2', "n", "only n = 1 is supported"),
    ('"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {'
     '"type": "string", "minLength": 1000000000000}}}', "response_format.json_schema.schema.minLength", "must be at most 10000"),
    ('"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments":'
     f' "{nested(200)}"}}}}]}}]', "messages[0].tool_calls[0].function.arguments", "nested deeper than 128"),
], ids=lambda v: v if len(v) < 30 else None)
async def test_out_of_range_values_are_400_naming_the_field(adapter: tuple[HttpServer, FakeBroker], extra: str,
                                                            param: str, message: str) -> None:
    server, broker = adapter
    body = chat(extra) if not extra.startswith('"messages"') else f'{{"model": "tiny", {extra}}}'.encode()
    error = assert_error(await roundtrip(server, request("POST", "/v1/chat/completions", body)), 400,
                         error_code(param))
    assert error["param"] == param and message in error["message"], error["message"]
    assert broker.submitted == 0


def error_code(param: str) -> str:
    return "unsupported_schema" if param.startswith("response_format") else "invalid_value"


async def test_body_over_the_limit_is_413_before_it_is_read(adapter: tuple[HttpServer, FakeBroker]) -> None:
    server, broker = adapter
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {64 << 20}\r\n\r\n".encode()
    error = await rejected(server, head, 413, "request_too_large")  # 64 MiB declared, never sent
    assert error["message"] == f"request body over {4 << 20} bytes" and broker.submitted == 0


async def test_top_p_zero_and_repeat_penalty_reach_the_sampler_unchanged(adapter: tuple[HttpServer, FakeBroker]) -> None:
    server, broker = adapter
    reply = await roundtrip(server, request("POST", "/v1/chat/completions",
                                            chat('"top_p": 0, "temperature": 1.0, "repeat_penalty": 0.5')))
    assert reply.status == 200
    assert (broker.sampling.top_p, broker.sampling.temperature, broker.sampling.repeat_penalty) == (0.0, 1.0, 0.5)


async def test_the_official_client_reads_the_refusals(adapter: tuple[HttpServer, FakeBroker]) -> None:
    server, _ = adapter
    deep: Any = "x"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 extra_body={"metadata": deep})
        assert info.value.code == "invalid_json" and "nested deeper than" in info.value.message
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 extra_body={"repeat_penalty": 0})
        assert (info.value.code, info.value.param) == ("invalid_value", "repeat_penalty")


def test_loads_bounds() -> None:
    assert loads(nested(MAX_DEPTH)) == json.loads(nested(MAX_DEPTH)) and loads(b'"\\ud83d\\ude00"') == "\U0001f600"
    assert loads("1e400") == float("inf") and loads("[" + "9" * 4000 + "]") == [int("9" * 4000)]
    for text, message in [(nested(MAX_DEPTH + 1), "nested deeper than 128 levels"),
                          ('{"a": ' * 129 + "1" + "}" * 129, "nested deeper than 128 levels"),
                          ("NaN", "NaN is not a JSON value"), ('{"\\ud800": 1}', "lone UTF-16 surrogate"),
                          ('["\\udc00x"]', "lone UTF-16 surrogate (\\udc00)")]:
        with pytest.raises(JsonBodyError, match=message.replace("(", r"\(").replace(")", r"\)").replace("\\u", r"\\u")):
            loads(text)
    assert loads(nested(3), max_depth=3) == [[[]]]
