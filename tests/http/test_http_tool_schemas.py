"""Tool schemas as agent clients send them, at the real adapter (fake broker): keywords the grammar cannot
enforce (numeric bounds, `propertyNames`, unknown formats, unsafe patterns, `maxLength` past the cap) are
relaxed, never refused, on chat, Responses and Anthropic `tools`, and logged once per keyword per process;
what it can enforce stays in the grammar, which llama.cpp parses. `response_format` with `strict: true`
still refuses such a keyword by name; without `strict` it is relaxed like tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from adapter_helpers import FakeBroker, adapter_server
from http_helpers import assert_error, request, roundtrip
from structlog.testing import capture_logs

from skippy.adapter.grammar.json_schema import MAX_COUNT
from skippy.adapter.grammar.structured import RELAXED_LOGGED
from skippy.http.server import HttpServer
from skippy.runtime.grammar_sampler import check_grammar
from skippy.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.anyio
PARAMETERS = {"type": "object", "$schema": "http://json-schema.org/draft-07/schema#", "additionalProperties": False,
              "required": ["url", "mode"], "properties": {
                  "url": {"type": "string", "format": "uri"},
                  "when": {"type": "string", "format": "date-time"},
                  "timeout": {"type": "number", "minimum": 0, "maximum": 600000},
                  "limit": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
                  "headers": {"type": "object", "propertyNames": {"pattern": "^[A-Za-z-]+$"},
                              "additionalProperties": {"type": "string"}},
                  "glob": {"type": "string", "pattern": "^.*\\.py$"},
                  "id": {"type": "string", "pattern": "^[a-z]{2,5}$"},
                  "mode": {"const": "fast"},
                  "note": {"anyOf": [{"type": "string", "maxLength": 20 * MAX_COUNT}, {"type": "null"}]}}}
RELAXED = {"format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "propertyNames", "pattern",
           "maxLength"}
ASK = [{"role": "user", "content": "hi"}]
ROUTES = {  # each API's request with PARAMETERS as its one tool's schema
    "/v1/chat/completions": {"model": "tiny", "messages": ASK, "tools": [
        {"type": "function", "function": {"name": "fetch", "parameters": PARAMETERS}}]},
    "/v1/responses": {"model": "tiny", "input": "hi", "tools": [
        {"type": "function", "name": "fetch", "parameters": PARAMETERS}]},
    "/v1/messages": {"model": "tiny", "max_tokens": 8, "messages": ASK, "tools": [
        {"name": "fetch", "description": "fetch a url", "input_schema": PARAMETERS}]},
}


@pytest.fixture
async def adapter(tiny_model: Callable[..., Path]) -> AsyncIterator[tuple[HttpServer, FakeBroker]]:
    async with adapter_server(tiny_model("llama")) as served:
        yield served


async def post(server: HttpServer, path: str, body: dict[str, Any]) -> Any:
    return await roundtrip(server, request("POST", path, json.dumps(body).encode()))


async def test_tool_schemas_are_relaxed_never_refused_and_logged_once(
        adapter: tuple[HttpServer, FakeBroker], tiny_model: Callable[..., Path]) -> None:
    server, broker = adapter
    broker.ctx_size = 4096  # the tools prompt lists the schema
    RELAXED_LOGGED.clear()
    tokenizer = Tokenizer(tiny_model("llama"))
    try:
        with capture_logs() as logs:
            for path, body in [*ROUTES.items(), *ROUTES.items()]:
                reply = await post(server, path, body)
                assert reply.status == 200, (path, reply.json())
                grammar = broker.sampling.grammar
                check_grammar(tokenizer.vocab, grammar)
                for enforced in ('-mode ::= "\\"fast\\""', "-when ::= date-time-string", "-id-1 ::= [a-z]"):
                    assert enforced in grammar  # const, a known format, a safe pattern
    finally:
        tokenizer.close()
    relaxed = [(line["keyword"], line["where"]) for line in logs if line["event"] == "schema_keywords_relaxed"]
    assert sorted(k for k, _ in relaxed) == sorted(RELAXED)
    assert ("exclusiveMinimum", "tools[0].function.parameters.properties.limit.exclusiveMinimum") in relaxed
    assert ("maxLength", "tools[0].function.parameters.properties.note.anyOf[0].maxLength") in relaxed


async def test_response_format_relaxes_unless_strict(adapter: tuple[HttpServer, FakeBroker]) -> None:
    server, broker = adapter
    schema = {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}}}
    for strict in (None, False):
        spec = {"name": "x", "schema": schema, **({} if strict is None else {"strict": strict})}
        reply = await post(server, "/v1/chat/completions", {**ROUTES["/v1/chat/completions"], "tools": None,
                                                           "response_format": {"type": "json_schema", "json_schema": spec}})
        assert reply.status == 200 and broker.sampling.grammar is not None, reply.json()
    submitted = broker.submitted
    reply = await post(server, "/v1/chat/completions", {"model": "tiny", "messages": ASK, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}}})
    error = assert_error(reply, 400, "unsupported_schema")
    assert error["param"] == "response_format.json_schema.schema.properties.n.exclusiveMinimum"
    assert "is not supported" in error["message"] and broker.submitted == submitted
