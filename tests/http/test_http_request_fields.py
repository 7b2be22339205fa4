"""What the real agent clients send on their first request, on the real adapter over a fake broker
(tests/http's adapter_helpers): request fields no route knows are ignored on every API, logged once per
name and counted on /metrics (or a 400 naming them under `--strict-request-fields`), fields that would
change the answer are still refused, Claude Code's system turns inside `messages` are folded into the
system prompt, and the small routes clients probe: `GET`/`HEAD /` and `GET /v1/models/{id}`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from adapter_helpers import adapter_server
from http_helpers import Reply, request, roundtrip
from structlog.testing import capture_logs

from skippy.http.server import HttpServer

pytestmark = pytest.mark.anyio
ASK = [{"role": "user", "content": "hi"}]
# one body per API, each with fields its route does not know (the first what a real client sends)
ROUTES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("/v1/chat/completions", {"model": "tiny", "messages": ASK, "client_metadata": {"a": 1}, "frobnicate": 2},
     ["client_metadata", "frobnicate"]),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "frobnicate": 1}, ["frobnicate"]),
    ("/v1/responses", {"model": "tiny", "input": "hi", "client_metadata": {"x-codex-turn": "1"}},
     ["client_metadata"]),
    ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": ASK,
                      "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
                      "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, ["context_management"]),
    ("/v1/messages/count_tokens", {"model": "tiny", "messages": ASK, "context_management": {}}, ["context_management"]),
    ("/v1/responses/input_tokens", {"model": "tiny", "input": "hi", "client_metadata": {}}, ["client_metadata"]),
    ("/tokenize", {"content": "hi", "frobnicate": 1}, ["frobnicate"]),
    ("/detokenize", {"tokens": [72], "frobnicate": 1}, ["frobnicate"]),
    ("/apply-template", {"messages": ASK, "frobnicate": 1}, ["frobnicate"]),
]


async def post(server: HttpServer, path: str, body: dict[str, Any]) -> Reply:
    return await roundtrip(server, request("POST", path, json.dumps(body).encode(),
                                           {"Content-Type": "application/json"}))


async def get(server: HttpServer, path: str, method: str = "GET") -> Reply:
    return await roundtrip(server, request(method, path))


def ignored_count(metrics: str, route: str, field: str) -> float:
    prefix = f'skippy_request_fields_ignored_total{{field="{field}",route="{route}"}} '
    (line,) = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


async def test_unknown_fields_are_ignored_logged_once_and_counted(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        with capture_logs() as logs:
            for path, body, _ in ROUTES:
                for _ in range(2):
                    reply = await post(server, path, body)
                    assert reply.status == 200, (path, reply.body)
        logged = [(line["field"], line["route"]) for line in logs if line["event"] == "request_fields_ignored"]
        assert logged == [("client_metadata", "/v1/chat/completions"), ("frobnicate", "/v1/chat/completions"),
                          ("context_management", "/v1/messages")]  # once per name per process
        metrics = (await get(server, "/metrics")).body.decode()
        for path, _, fields in ROUTES:
            for field in fields:
                assert ignored_count(metrics, path, field) == 2, (path, field)
        counted = {line.split('field="')[1].split('"')[0] for line in metrics.splitlines()
                   if line.startswith("skippy_request_fields_ignored_total{")}
        assert counted == {field for _, _, fields in ROUTES for field in fields}  # thinking, output_config: known


async def test_strict_request_fields_refuses_them(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama"), strict_request_fields=True) as (server, broker):
        for path, body, fields in ROUTES:
            reply = await post(server, path, body)
            assert reply.status == 400, path
            error = reply.json()["error"]  # Anthropic's envelope on /v1/messages: no param, the message names it
            assert error["message"] == f"{fields[0]}: unrecognized request argument"
            assert error.get("param", fields[0]) == fields[0]
        known = await post(server, "/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": ASK,
                                                    "thinking": {"type": "adaptive"}})
        assert known.status == 200 and broker.submitted == 1


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"n": 2}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "http://x/y.png"}}]}]}, "messages[0].content[0]"),
    ("/v1/chat/completions", {"audio": {"voice": "x"}}, "audio"),
    ("/v1/chat/completions", {"suffix": "x"}, "suffix"),  # the other route's field
    ("/v1/responses", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("/v1/messages", {"mcp_servers": [{}]}, "mcp_servers"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]"),
])
async def test_fields_that_change_the_answer_are_still_refused(tiny_model: Callable[..., Path], path: str,
                                                               body: dict[str, Any], param: str) -> None:
    base = {"model": "tiny", "messages": ASK, "input": "hi"} if path != "/v1/messages" else {
        "model": "tiny", "max_tokens": 4, "messages": ASK}
    if path == "/v1/responses":
        del base["messages"]
    elif path != "/v1/messages":
        del base["input"]
    async with adapter_server(tiny_model("llama")) as (server, broker):
        reply = await post(server, path, {**base, **body})
        assert reply.status == 400 and param in reply.body.decode(), reply.body
        assert broker.submitted == 0


async def test_system_turns_in_messages_are_folded_into_the_system_prompt(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama")) as (server, broker):
        broker.ctx_size = 1024  # the tiny model's tokenizer spends a token or so per character
        reply = await post(server, "/v1/messages", {
            "model": "tiny", "max_tokens": 4, "system": [{"type": "text", "text": "TOP"}],
            "messages": [{"role": "user", "content": "U1"}, {"role": "system", "content": "S1"},
                         {"role": "assistant", "content": "A1"},
                         {"role": "system", "content": [{"type": "text", "text": "S2"}]},
                         {"role": "user", "content": "U2"}]})
        assert reply.status == 200, reply.body
        folded = await post(server, "/apply-template", {"messages": [
            {"role": "system", "content": "TOP\n\nS1\n\nS2"}, {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]})
        expected = await post(server, "/tokenize", {"content": folded.json()["prompt"], "add_special": True})
        assert broker.prompt == expected.json()["tokens"]
        text = (await post(server, "/detokenize", {"tokens": broker.prompt})).json()["content"]
        assert text.index("TOP") < text.index("S1") < text.index("S2") < text.index("U1") < text.index("A1")


async def test_the_routes_clients_probe(tiny_model: Callable[..., Path]) -> None:
    async with adapter_server(tiny_model("llama"), api_key="sk-test") as (server, broker):
        key = {"Authorization": "Bearer sk-test"}
        root = await roundtrip(server, request("GET", "/", headers=key))
        assert root.status == 200 and root.json() == {"server": "skippy", "model": "tiny"}
        head = await roundtrip(server, request("HEAD", "/", headers=key))
        assert head.status == 200 and head.body == b""
        assert (await get(server, "/")).status == 401  # `/` wants the key, as every route but /health and /readyz
        model = await roundtrip(server, request("GET", "/v1/models/tiny", headers=key))
        listed = await roundtrip(server, request("GET", "/v1/models", headers=key))
        assert model.status == 200 and model.json() == listed.json()["data"][0]
        other = await roundtrip(server, request("GET", "/v1/models/gpt-5", headers=key))
        assert other.status == 404 and other.json()["error"]["code"] == "model_not_found"
        assert other.json()["error"]["param"] == "model" and "gpt-5" in other.json()["error"]["message"]
        assert (await roundtrip(server, request("GET", "/v1/models/", headers=key))).status == 404
