"""The agent APIs against `skippy up` on the tiny llama (2 real stages, broker, adapter), driven by their official
SDKs: the OpenAI Responses API (`openai`: `responses.create`, `responses.stream`'s accumulator,
`responses.input_tokens.count`) and the Anthropic Messages API (`anthropic`: `messages.create`,
`messages.stream`'s accumulator, `messages.count_tokens`), whole and streamed, with tools forced through the
grammar, the Codex- and Claude-Code-shaped requests of docs/agent-apis.md, and bad requests answered with a
4xx in each API's envelope naming the field.

The tiny model's weights are random: text is whatever greedy decoding gives (compared whole vs streamed), and
only the grammar makes a call valid. Greedy runs repeat exactly only when the next request's cells and
batches are the same: no prefix cache (see test_openai_structured's docstring), fixed prefill chunks (the
default adaptive ramp sizes a long prompt's chunks by timing, and llama.cpp is not batch-invariant), and
each comparison waits for the pipeline to be idle first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import agent_checks as checks
import anthropic
import openai
import pytest
from structured_checks import PET
from up_helpers import SkippyServer, wait_idle


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    # the tests compare a streamed and a whole reply of one greedy request: with speculation on, the two can take
    # different verify windows (the policy's prices follow the served batches) and part at a near-tie of the tiny
    # model (CI flake: a forced tool call's arguments); these tests are about the APIs, so decode plainly
    with start_up("up-agent-apis", tiny_llama, "--ctx-size", "2048", "--no-prefix-cache", "--no-speculative",
                  "--openai-prefill-chunk-policy", "fixed") as s:
        yield s


@pytest.fixture(scope="module")
def claude(server: SkippyServer) -> Iterator[anthropic.Anthropic]:
    c = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120.0)
    yield c
    c.close()


# -- OpenAI Responses --------------------------------------------------------------------------------------------
def test_responses_text_whole_and_streamed_agree(server: SkippyServer, client: openai.OpenAI) -> None:
    ask = {"model": server.model_id, "input": "Name three colors.", "instructions": "Be brief.",
           "max_output_tokens": 6, "temperature": 0}
    whole = client.responses.create(**ask, store=True)  # accepted and ignored: nothing is stored
    assert whole.store is False and whole.status == "incomplete" and whole.incomplete_details and \
        whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage and whole.usage.output_tokens == 6 and whole.id.startswith("resp_")
    wait_idle(server)  # greedy runs repeat only when the next does not share the pipeline with the last
    final = checks.check_response_events(list(client.responses.create(stream=True, **ask)))
    assert final.status == "incomplete" and final.output_text == whole.output_text
    count = client.responses.input_tokens.count(model=server.model_id, input=ask["input"], instructions="Be brief.")
    assert count.input_tokens == whole.usage.input_tokens


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}], ids=["required", "named"])
def test_responses_forced_tool_call_through_the_sdk_accumulator(server: SkippyServer, client: openai.OpenAI,
                                                                choice: Any) -> None:
    ask = {"model": server.model_id, "input": "What time is it in Oslo?", "tools": checks.RESPONSES_TOOLS,
           "tool_choice": choice, "max_output_tokens": 300, "temperature": 0}
    with client.responses.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[-1].type == "response.completed" and final.status == "completed"
    (call,) = final.output
    assert call.type == "function_call" and call.call_id.startswith("call_")
    checks.valid_call(call.name, call.arguments)
    if isinstance(choice, dict):
        assert call.name == "get_time"
    wait_idle(server)
    whole = client.responses.create(**ask)
    assert whole.output[0].type == "function_call"
    assert (whole.output[0].name, json.loads(whole.output[0].arguments)) == (call.name, json.loads(call.arguments))


def test_responses_json_schema_text_format_validates(server: SkippyServer, client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "name": "pet", "schema": PET, "strict": True}
    r = client.responses.create(model=server.model_id, input="A pet, please.", text={"format": fmt},
                                max_output_tokens=400, temperature=0)
    assert r.status == "completed"
    checks.valid_call("pet", r.output_text, {"pet": PET})


def test_responses_codex_shaped_request(server: SkippyServer, client: openai.OpenAI) -> None:
    """Codex's request: stream, instructions, a function tool next to a web_search tool (ignored), reasoning,
    include, store false, prompt_cache_key, and a history of a call and its output."""
    final = checks.check_response_events(list(client.responses.create(
        model=server.model_id, max_output_tokens=200, temperature=0, **checks.CODEX_REQUEST)))
    assert final.status in ("completed", "incomplete") and final.store is False
    for item in final.output:
        if item.type == "function_call" and final.status == "completed":
            checks.valid_call(item.name, item.arguments, {"shell": checks.CODEX_REQUEST["tools"][0]["parameters"]})
    forced = client.responses.create(model=server.model_id, max_output_tokens=200, temperature=0,
                                     **{**checks.CODEX_REQUEST, "stream": False, "tool_choice": "required"})
    (call,) = forced.output
    assert call.type == "function_call" and call.name == "shell"


@pytest.mark.parametrize(("fields", "status", "param"), [
    ({"previous_response_id": "resp_123"}, 400, "previous_response_id"),
    ({"conversation": "conv_1"}, 400, "conversation"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, 400,
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0].type"),
    ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"temperature": 3}, 400, "temperature"),
    ({"tools": [{"type": "web_search"}, {"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integr"}}}}]}, 400,
     "tools[1].parameters.properties.n.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "oneOf": []}}}}, 400,
     "text.format.schema.oneOf"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": checks.RESPONSES_TOOLS}, 400, "tool_choice.name"),
    ({"model": "gpt-5"}, 404, "model")])
def test_responses_bad_requests_name_the_field(server: SkippyServer, client: openai.OpenAI, fields: dict[str, Any],
                                               status: int, param: str) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(**{"model": server.model_id, "input": "hi", "max_output_tokens": 4, **fields})
    body: Any = caught.value.body
    assert caught.value.status_code == status and body["param"] == param, body


# -- Anthropic Messages ------------------------------------------------------------------------------------------
def test_messages_text_whole_and_streamed_agree(server: SkippyServer, claude: anthropic.Anthropic) -> None:
    ask: dict[str, Any] = {"model": server.model_id, "max_tokens": 6, "system": "Be brief.",
                           "messages": [{"role": "user", "content": "Name three colors."}],
                           "extra_body": {"temperature": 0}}
    whole = claude.messages.create(**ask)
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 6 and whole.content[0].type == "text"
    wait_idle(server)
    with claude.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    checks.check_message_events([e for e in events if e.type in checks.RAW_MESSAGE_EVENTS])
    assert final.content[0].type == "text" and final.content[0].text == whole.content[0].text
    assert final.usage.input_tokens == whole.usage.input_tokens
    count = claude.messages.count_tokens(model=server.model_id, system="Be brief.", messages=ask["messages"])
    assert count.input_tokens == whole.usage.input_tokens
    raw = server.request("POST", "/v1/messages", {**{k: v for k, v in ask.items() if k != "extra_body"},
                                                  "temperature": 0, "stream": True})
    names = [name for name, _ in checks.sse_events(raw.body)]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]


def test_messages_stop_sequence_is_reported(server: SkippyServer, claude: anthropic.Anthropic) -> None:
    ask: dict[str, Any] = {"model": server.model_id, "max_tokens": 12, "messages": [{"role": "user", "content": "Hi"}],
                           "extra_body": {"temperature": 0}}
    text = claude.messages.create(**ask).content[0].text
    stop = text[len(text) // 2:][:2]
    assert stop.strip(), text
    wait_idle(server)
    r = claude.messages.create(**ask, stop_sequences=["never here", stop])
    assert (r.stop_reason, r.stop_sequence, r.content[0].text) == ("stop_sequence", stop, text[:text.index(stop)])


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}], ids=["any", "tool"])
def test_messages_forced_tool_use(server: SkippyServer, claude: anthropic.Anthropic, choice: Any) -> None:
    ask: dict[str, Any] = {"model": server.model_id, "max_tokens": 300, "tools": checks.ANTHROPIC_TOOLS,
                           "tool_choice": choice, "messages": [{"role": "user", "content": "Time in Oslo?"}],
                           "extra_body": {"temperature": 0}}
    with claude.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (use,) = final.content
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    checks.valid_call(use.name, use.input)
    if choice["type"] == "tool":
        assert use.name == "get_time"
    wait_idle(server)
    whole = claude.messages.create(**ask)
    assert whole.stop_reason == "tool_use" and (whole.content[0].name, whole.content[0].input) == (use.name, use.input)


def test_messages_claude_code_shaped_request(server: SkippyServer, claude: anthropic.Anthropic) -> None:
    """Claude Code's request: stream, system blocks with cache_control, tools with input_schema, max_tokens 32000
    (clamped to what the context leaves), metadata.user_id, a tool_use / tool_result history."""
    request = {**checks.CLAUDE_CODE_REQUEST, "tool_choice": {"type": "any"}}
    with claude.messages.stream(model=server.model_id, **{k: v for k, v in request.items() if k != "stream"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    schemas = {t["name"]: t["input_schema"] for t in checks.CLAUDE_CODE_REQUEST["tools"]}
    checks.valid_call(final.content[0].name, final.content[0].input, schemas)
    as_sent = server.request("POST", "/v1/messages", {"model": server.model_id, **checks.CLAUDE_CODE_REQUEST,
                                                      "temperature": 0})
    events = dict(checks.sse_events(as_sent.body))  # one message_start, one message_delta
    assert as_sent.status == 200 and list(events)[-1] == "message_stop", as_sent.body
    used = events["message_start"]["message"]["usage"]["input_tokens"] + events["message_delta"]["usage"]["output_tokens"]
    assert events["message_delta"]["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use") and used <= 2048


@pytest.mark.parametrize(("body", "status", "kind", "says"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens: is required"),
    ({"max_tokens": 4, "messages": [{"role": "tool", "content": "hi"}]}, 400, "invalid_request_error",
     "messages[0].role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "messages[0].content[0]"),
    ({"max_tokens": 4, "temperature": 1.5, "messages": [{"role": "user", "content": "hi"}]}, 400,
     "invalid_request_error", "temperature"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "input_schema": {
        "type": "object", "properties": {"n": {"type": "integr"}}}}]}, 400, "invalid_request_error",
     "tools[0].input_schema.properties.n.type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": checks.ANTHROPIC_TOOLS,
      "stop_sequences": ["}"]}, 400, "invalid_request_error", "stop_sequences"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "mcp_servers": [{}]}, 400,
     "invalid_request_error", "mcp_servers"),
    ({"max_tokens": 4, "model": 4, "messages": [{"role": "user", "content": "hi"}]}, 400,
     "invalid_request_error", "model")])  # any model name is served (Claude Code names Anthropic's), not a number
def test_messages_bad_requests_in_anthropics_envelope(server: SkippyServer, claude: anthropic.Anthropic,
                                                      body: dict[str, Any], status: int, kind: str, says: str) -> None:
    raw = server.request("POST", "/v1/messages", {"model": server.model_id, **body})
    assert raw.status == status and raw.json()["type"] == "error"
    assert raw.json()["error"]["type"] == kind and raw.json()["error"]["message"].startswith(says), raw.json()
    if "max_tokens" not in body:  # the SDK will not send a request without it
        return
    named = {k: v for k, v in body.items() if k in ("model", "max_tokens", "messages", "tools", "stop_sequences")}
    with pytest.raises(anthropic.APIStatusError) as caught:  # the SDK reads it as the same error
        claude.messages.create(**{"model": server.model_id, **named,
                                  "extra_body": {k: v for k, v in body.items() if k not in named}})
    assert caught.value.status_code == status and caught.value.body == raw.json()
