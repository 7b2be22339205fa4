"""Checks of structured output, tool calls, tokenize, CORS and refused fields with the official client,
shared by the tiny-model and the Gemma end-to-end tests (each passes its server and client)."""

from __future__ import annotations

import json
from typing import Any

import openai
from schema_check import schema_error
from up_helpers import SkippyServer

PET = {"type": "object", "additionalProperties": False, "required": ["kind", "owner", "tags"], "properties": {
    "kind": {"enum": ["cat", "dog", "fish"]},
    "owner": {"type": "object", "required": ["name", "age"], "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}},
    "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["small", "loud", "old"]}}}}
WEATHER = {"type": "object", "required": ["city", "unit"], "properties": {
    "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
                                      "parameters": {"type": "object", "required": ["city"], "properties": {
                                          "city": {"type": "string", "maxLength": 16}}}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def schema_format(schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def structured(client: openai.OpenAI, model: str, prompt: str, schema: dict[str, Any], **kw: Any) -> tuple[str, str]:
    """(finish_reason, content) of a json_schema request; when it finished with stop the content validates."""
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                       response_format=schema_format(schema), **kw)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    content = choice.message.content or ""
    if choice.finish_reason == "stop":
        assert schema_error(json.loads(content), schema) is None, content
    return choice.finish_reason, content


def streamed_text(client: openai.OpenAI, model: str, **kw: Any) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def tool_call(client: openai.OpenAI, model: str, prompt: str, choice: Any, stream: bool, **kw: Any) -> tuple[str, Any]:
    """A forced call: (function name, parsed arguments), checked against the function's schema."""
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=choice, **kw)
        assert r.choices[0].finish_reason == "tool_calls", r
        (call,) = r.choices[0].message.tool_calls or []
        assert call.type == "function" and call.id.startswith("call_")
        name, arguments = call.function.name, call.function.arguments
    else:
        name, arguments, finish, ids = "", "", None, set()
        for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=choice,
                                                    stream=True, **kw):
            if not chunk.choices:
                continue
            for delta in chunk.choices[0].delta.tool_calls or []:
                assert delta.index == 0
                ids |= {delta.id} if delta.id else set()
                name += delta.function.name or "" if delta.function else ""
                arguments += delta.function.arguments or "" if delta.function else ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and len(ids) == 1
    value = json.loads(arguments)
    assert schema_error(value, PARAMS[name]) is None, arguments
    return name, value


def tokenize_round_trip(server: SkippyServer, text: str) -> list[int]:
    tokens = server.request("POST", "/tokenize", {"content": text}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    pieces = server.request("POST", "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    content = server.request("POST", "/detokenize", {"tokens": tokens}).json()["content"]
    assert content.strip() == text.strip()
    raw = [p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces]  # bytes: not UTF-8
    assert b"".join(raw) == content.encode()
    with_bos = server.request("POST", "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    assert len(with_bos) == len(tokens) + 1 and with_bos[1:] == tokens
    bad = server.request("POST", "/detokenize", {"tokens": [10**9]})
    assert bad.status == 400 and bad.json()["error"]["param"] == "tokens"
    return tokens


def cors_preflight(server: SkippyServer) -> None:
    """No origin is allowed by default: the preflight is answered, without Access-Control-Allow-Origin."""
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/models"):
        resp = server.request("OPTIONS", path, headers={"Origin": "http://ui.example",
                                                         "Access-Control-Request-Method": "POST"})
        assert resp.status == 204 and "OPTIONS" in resp.headers["allow"] and resp.body == b""
        assert "access-control-allow-origin" not in resp.headers


def refusals(client: openai.OpenAI, model: str) -> None:
    """Fields the server cannot honour are 400s naming them; a field it does not use is ignored."""
    hi = [{"role": "user", "content": "hi"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"n": 2}, "n"), ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"response_format": schema_format({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}})},
         "response_format.json_schema.schema.properties.age.minimum"),
        ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
         "messages[0].content[0]"),
    ]
    for fields, param in cases:
        try:
            client.chat.completions.create(model=model, **{"messages": hi, "max_tokens": 4, **fields})
        except openai.BadRequestError as exc:
            body: Any = exc.body
            assert body["param"] == param, (fields, body)
        else:
            raise AssertionError(f"{fields} was accepted")
    ignored = client.chat.completions.create(model=model, messages=hi, max_tokens=4, extra_body={"wat": 1})
    assert ignored.choices[0].finish_reason in ("stop", "length")  # logged once and counted, not refused
