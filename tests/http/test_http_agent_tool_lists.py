"""The real agent clients' tool lists and the request shapes they send, on the real adapter over a fake broker
(tests/http's adapter_helpers).

tests/data/agent_tools holds the tools Codex CLI and Claude Code sent on their first requests to `skippy up` (pinned
versions: scripts/setup-agents; captured through tests/openai/agent_proxy.py): every function tool of both lists
converts to a grammar llama.cpp parses, offered all at once (auto) and forced one by one, and no tool is refused
(Codex's `namespace` and `web_search` tools are left out and logged). Claude Code's deferred tools
(`defer_loading`, its tool search) stay out of the prompt until a `tool_reference` in a tool result loads them;
keys a client adds inside a message or a format object are ignored, or refused under `--strict-request-fields`.
"""

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
from skippy.runtime.grammar_sampler import check_grammar
from skippy.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.anyio
DATA = Path(__file__).resolve().parents[1] / "data" / "agent_tools"
CODEX = json.loads((DATA / "codex-0.171.0.json").read_text())
CLAUDE = json.loads((DATA / "claude-code-2.1.332.json").read_text())
ASK = [{"role": "user", "content": "hi"}]


async def post(server: HttpServer, path: str, body: dict[str, Any]) -> Reply:
    return await roundtrip(server, request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}))


def codex_body(choice: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": "hi", "tools": CODEX["tools"], "tool_choice": choice, "stream": False}


def claude_body(choice: Any, messages: list[Any] = ASK) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 8, "messages": messages, "tools": CLAUDE["tools"], "tool_choice": choice}


async def test_every_tool_of_both_clients_converts_to_a_grammar(tiny_model: Callable[..., Path]) -> None:
    functions = [("/v1/responses", t["name"], codex_body({"type": "function", "name": t["name"]}))
                 for t in CODEX["tools"] if t["type"] == "function"]
    functions += [("/v1/messages", t["name"], claude_body({"type": "tool", "name": t["name"]}))
                  for t in CLAUDE["tools"] if not t.get("defer_loading")]
    assert len(functions) == 7 + 22  # Codex: 7 functions besides a namespace and web_search; Claude: 1 deferred
    tokenizer = Tokenizer(tiny_model("llama"))
    try:
        async with adapter_server(tiny_model("llama")) as (server, broker):
            broker.ctx_size = 131072  # Claude Code's tools alone are ~60k tokens of the tiny model's vocabulary
            with capture_logs() as logs:
                for path, body in (("/v1/responses", codex_body("auto")), ("/v1/messages", claude_body({"type": "auto"}))):
                    reply = await post(server, path, body)
                    assert reply.status == 200, (path, reply.body)
                    check_grammar(tokenizer.vocab, broker.sampling.grammar)  # auto: any of the tools, or text
            ignored = {line["event"]: line["tools"] for line in logs if line["event"].endswith("_tools_ignored")}
            assert ignored == {"responses_tools_ignored": ["multi_agent_v1 (namespace)", "web_search (web_search)"],
                               "messages_tools_ignored": ["DeferredToolPlaceholder (deferred)"]}
            for path, name, body in functions:
                reply = await post(server, path, body)
                assert reply.status == 200, (path, name, reply.body)
                grammar = broker.sampling.grammar
                check_grammar(tokenizer.vocab, grammar)
                assert json.dumps(json.dumps(name))[1:-1] in grammar, name  # the call's name, a JSON string literal
    finally:
        tokenizer.close()


async def test_deferred_tools_load_on_a_tool_reference(tiny_model: Callable[..., Path]) -> None:
    deferred = {"name": "WebFetch", "description": "Fetches a URL.", "defer_loading": True,
                "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}
    search = next(t for t in CLAUDE["tools"] if t["name"] == "ToolSearch")
    searched = [{"role": "user", "content": "fetch it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch",
                                                   "input": {"query": "select:WebFetch"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "tool_reference", "tool_name": "WebFetch"}]}]}]
    forced = {"type": "tool", "name": "WebFetch"}
    async with adapter_server(tiny_model("llama")) as (server, broker):
        broker.ctx_size = 8192
        body = {"model": "tiny", "max_tokens": 8, "tools": [search, deferred], "tool_choice": forced}
        before = await post(server, "/v1/messages", {**body, "messages": ASK})
        assert before.status == 400 and "tool_choice.name: 'WebFetch' is not one of the tools (ToolSearch)" in \
            before.json()["error"]["message"]
        after = await post(server, "/v1/messages", {**body, "messages": searched})
        assert after.status == 200, after.body
        assert '"\\"WebFetch\\""' in broker.sampling.grammar
        text = (await post(server, "/detokenize", {"tokens": broker.prompt})).json()["content"]
        assert "Tool loaded: WebFetch" in text and text.count('"name": "WebFetch"') == 1  # listed once, loaded


@pytest.mark.parametrize("strict", [False, True], ids=["ignored", "strict"])
async def test_keys_a_client_adds_inside_objects(tiny_model: Callable[..., Path], strict: bool) -> None:
    cases = [("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": [{**ASK[0], "id": "msg_1"}]},
              "messages[].id"),
             ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": ASK,
                               "output_config": {"effort": "high", "task_budget": {"total": 9}}},
              "output_config.task_budget"),
             ("/v1/responses", {"model": "tiny", "input": "hi", "text": {"verbosity": "low", "future": 1}},
              "text.future")]
    async with adapter_server(tiny_model("llama"), strict_request_fields=strict) as (server, broker):
        for path, body, name in cases:
            reply = await post(server, path, body)
            if strict:
                assert reply.status == 400 and f"{name}: unrecognized request argument" in reply.body.decode(), name
            else:
                assert reply.status == 200, (name, reply.body)
        assert broker.submitted == (0 if strict else len(cases))
