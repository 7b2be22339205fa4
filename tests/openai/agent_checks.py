"""Shapes and checks for the agent APIs (OpenAI Responses, Anthropic Messages) driven by their official SDKs:
the tools in each API's own form, the event-order checks of each stream, and the Codex- and Claude-Code-shaped
requests that docs/agent-apis.md shows."""

from __future__ import annotations

import json
import re
from typing import Any

from schema_check import schema_error
from structured_checks import PARAMS, TOOLS

RESPONSES_TOOLS: list[Any] = [{"type": "function", **t["function"]} for t in TOOLS]
ANTHROPIC_TOOLS: list[Any] = [{"name": t["function"]["name"], "description": t["function"]["description"],
                               "input_schema": t["function"]["parameters"]} for t in TOOLS]

# What Codex CLI sends (codex-rs's Responses request): instructions, its tools (a function tool and hosted tools
# it knows the server may ignore), reasoning, include, store false, a prompt cache key, the conversation as items.
CODEX_REQUEST: dict[str, Any] = {
    "instructions": "You are a coding agent running in the Codex CLI. Use the shell tool to inspect files.",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in README.md?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "shell",
         "arguments": json.dumps({"command": ["cat", "README.md"]})},
        {"type": "function_call_output", "call_id": "call_1", "output": "# skippy\nServes one GGUF model split by layers."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Now list the directory."}]}],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
         "strict": False, "parameters": {"type": "object", "required": ["command"], "additionalProperties": False,
                                         "properties": {"command": {"type": "array", "maxItems": 4,
                                                                    "items": {"type": "string", "maxLength": 12}},
                                                        "workdir": {"type": "string", "maxLength": 12}}}},
        {"type": "web_search"}],
    "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False, "stream": True, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "codex-session-1"}

# What Claude Code sends (the Messages API): system blocks with cache_control, its tools with input_schema,
# max_tokens 32000 (over any small model's context: clamped), metadata.user_id, a tool_use / tool_result history.
CLAUDE_CODE_REQUEST: dict[str, Any] = {
    "max_tokens": 32000, "stream": True, "metadata": {"user_id": "user_abc_account_def_session_1"},
    "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
               {"type": "text", "text": "Use the tools to answer.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "Bash", "description": "Executes a bash command.",
               "input_schema": {"type": "object", "required": ["command"], "additionalProperties": False,
                                "properties": {"command": {"type": "string", "maxLength": 24},
                                               "description": {"type": "string", "maxLength": 24}}}},
              {"name": "Read", "description": "Reads a file.", "cache_control": {"type": "ephemeral"},
               "input_schema": {"type": "object", "required": ["file_path"],
                                "properties": {"file_path": {"type": "string", "maxLength": 24}}}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in README.md?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me read it."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "README.md"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "# skippy"}]},
                                     {"type": "text", "text": "Now list the files.",
                                      "cache_control": {"type": "ephemeral"}}]}]}

_RESPONSE_EVENTS = {"response.created": "C", "response.in_progress": "P", "response.output_item.added": "[",
                    "response.content_part.added": "(", "response.output_text.delta": "t",
                    "response.output_text.done": "T", "response.content_part.done": ")",
                    "response.function_call_arguments.delta": "a", "response.function_call_arguments.done": "A",
                    "response.output_item.done": "]", "response.completed": "D", "response.incomplete": "I"}
_RESPONSE_ORDER = re.compile(r"CP(\[\(t*T\)\]|\[a*A\])+[DI]")


def check_response_events(events: list[Any]) -> Any:
    """The Responses stream's order, sequence numbers, output indexes and item ids; returns the last response."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    order = "".join(_RESPONSE_EVENTS[e.type] for e in events)
    assert _RESPONSE_ORDER.fullmatch(order), order
    items: dict[int, str] = {}
    for e in events:
        if e.type == "response.output_item.added":
            assert e.output_index == len(items)
            items[e.output_index] = e.item.id
        elif hasattr(e, "item_id"):
            assert items[e.output_index] == e.item_id
    final = events[-1].response
    assert [item.id for item in final.output] == [items[i] for i in sorted(items)]
    assert final.id == events[0].response.id
    return final


_MESSAGE_ORDER = re.compile(r"S(B[td]*E)*MZ")
_MESSAGE_EVENTS = {"message_start": "S", "content_block_start": "B", "content_block_stop": "E",
                   "message_delta": "M", "message_stop": "Z"}
RAW_MESSAGE_EVENTS = {*_MESSAGE_EVENTS, "content_block_delta"}  # what the wire sends; the SDK's stream adds its own


def check_message_events(events: list[Any]) -> None:
    """The Messages stream's order (pings skipped by the SDK) and block indexes."""
    order = "".join(_MESSAGE_EVENTS.get(e.type) or ("t" if e.delta.type == "text_delta" else "d") for e in events)
    assert _MESSAGE_ORDER.fullmatch(order), order
    index = -1
    for e in events:
        if e.type == "content_block_start":
            index += 1
        if e.type.startswith("content_block_"):
            assert e.index == index


def valid_call(name: str, arguments: Any, schemas: dict[str, Any] | None = None) -> None:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    schema = (schemas or PARAMS)[name]
    assert schema_error(value, schema) is None, (name, value)


def sse_events(body: bytes) -> list[tuple[str, Any]]:
    """A raw SSE body's events as (the `event:` name, the parsed `data:`), in order."""
    events = []
    for block in body.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events
