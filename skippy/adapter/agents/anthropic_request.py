"""An Anthropic Messages request (`POST /v1/messages`) -> the chat completions body it means (skippy.adapter.agents.translation).

- `system`: a string or text blocks (`cache_control` and other block fields accepted and ignored).
- `messages`: roles user and assistant, and system (Claude Code's; folded in order into the system prompt,
  after the top-level `system`, never mid-conversation); content a string or blocks: `text`; a user's `tool_result`
  (`tool_use_id`, `content` a string or text blocks, `is_error`) goes back as a tool result (before the
  turn's text, as Anthropic orders them); an assistant's `tool_use` (`id`, `name`, `input`) is its call;
  `thinking` / `redacted_thinking` blocks are dropped (this model does not think); image and document
  blocks are a 400 (no multimodal projector). A message's other fields are ignored, as unknown fields are.
- `tools`: custom tools (`name`, `description`, `input_schema`; `cache_control` and other tool fields
  ignored) become chat function tools; server and Anthropic-defined tools (a `type` other than `custom`:
  `web_search_20250305`, `bash_20250124`, ...) are ignored and logged. A deferred tool (`defer_loading`:
  Claude Code's tool search) is left out until a `tool_reference` block in a tool result names it (a
  client-side search loaded it: the block reads as text naming the tool, the tool is shown from then on).
  `tool_choice` auto / any (a call is forced by the grammar) / tool (that one, forced) / none;
  `disable_parallel_tool_use` accepted.
- `max_tokens` is required; a value over what the context leaves is clamped to it (Claude Code sends
  32000). `stop_sequences` (any number), `temperature` in [0, 1], `top_p`, `top_k`, `stream`;
  `output_config.format` (`{"type": "json_schema", "schema"}`) through the grammar, as chat's
  response_format. Accepted and meaningless here: `metadata` (`user_id`), `thinking`, `output_config.effort`,
  `service_tier`, a top-level `cache_control`, `inference_geo`, `speed`, `diagnostics`, `user_profile_id`,
  `workspace_id`. `container` and `mcp_servers` are refused; any other field (Claude Code's
  `context_management`, another key of `output_config`) is ignored (skippy.adapter.request_fields).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from skippy.adapter.agents.translation import Renames, Translated, chat_tools, check_fields, format_of, keep
from skippy.adapter.chat_messages import MEDIA_PARTS, text_parts
from skippy.adapter.request_fields import ignore_unknown
from skippy.http.errors import invalid

PASSED = ("model", "stream", "top_p", "top_k")
MEANINGLESS = ("metadata", "thinking", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics",
               "user_profile_id", "workspace_id")
KNOWN = (*PASSED, *MEANINGLESS, "messages", "system", "max_tokens", "stop_sequences", "temperature", "tools",
         "tool_choice", "output_config")
REFUSED = {"mcp_servers": "MCP servers are not supported", "container": "containers are not supported"}
DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _blocks(content: Any, param: str) -> list[tuple[int, dict[str, Any]]]:
    if isinstance(content, str):
        return [(0, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise invalid(param, "expected a string or a list of content blocks")
    blocks = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid(f"{param}[{j}]", "expected a content block with a type")
        blocks.append((j, block))
    return blocks


def _text(block: dict[str, Any], where: str, expected: str) -> str:
    kind = block["type"]
    if kind in MEDIA_PARTS:
        raise invalid(where, f"{kind} blocks need a multimodal projector; this server takes text only")
    if kind != "text":
        raise invalid(f"{where}.type", f"{kind!r} blocks are not supported here ({expected})")
    if not isinstance(block.get("text"), str):
        raise invalid(f"{where}.text", "expected a string")
    return str(block["text"])


def _user(content: Any, param: str) -> list[dict[str, Any]]:
    """A user turn: its tool results first (as tool messages), then its text."""
    results, texts = [], []
    for j, block in _blocks(content, param):
        where = f"{param}[{j}]"
        if block["type"] == "tool_result":
            use_id = block.get("tool_use_id")
            if not isinstance(use_id, str) or not use_id:
                raise invalid(f"{where}.tool_use_id", "expected the id of the tool_use this answers")
            text = text_parts(_loaded_tools_as_text(block.get("content", "")), f"{where}.content", ("text",))
            results.append({"role": "tool", "tool_call_id": use_id,
                            "content": f"Error: {text}" if block.get("is_error") else text})
        else:
            texts.append(_text(block, where, "text, tool_result"))
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _assistant(content: Any, param: str) -> dict[str, Any]:
    texts, calls = [], []
    for j, block in _blocks(content, param):
        where = f"{param}[{j}]"
        if block["type"] == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise invalid(where, 'expected {"type": "tool_use", "id": ..., "name": ..., "input": {...}}')
            if not isinstance(block.get("input"), dict):
                raise invalid(f"{where}.input", "expected an object")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}})
        elif block["type"] not in DROPPED_BLOCKS:
            texts.append(_text(block, where, "text, tool_use, thinking"))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(value: Any, system: Any) -> list[dict[str, Any]]:
    """The chat messages; system turns inside `messages` (Claude Code sends them) are folded, in order, into
    the one system prompt after the top-level `system`."""
    out: list[dict[str, Any]] = []
    systems = [] if system is None else [text_parts(system, "system", ("text",))]
    if not isinstance(value, list) or not value:
        raise invalid("messages", "expected a non-empty list of messages")
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(param, "expected an object with role and content")
        ignore_unknown(f"messages[].{key}" for key in message if key not in ("role", "content"))
        role = message.get("role")
        if role == "user":
            out += _user(message.get("content"), f"{param}.content")
        elif role == "assistant":
            out.append(_assistant(message.get("content"), f"{param}.content"))
        elif role == "system":
            systems.append(text_parts(message.get("content"), f"{param}.content", ("text",)))
        else:
            raise invalid(f"{param}.role", f'expected "user", "assistant" or "system", got {role!r}')
    return ([{"role": "system", "content": "\n\n".join(systems)}] if systems else []) + out


def _loaded_tools_as_text(content: Any) -> Any:
    """A tool result's `tool_reference` blocks (a client-side tool search's answer: these tools are loaded now) as
    text naming each tool; the tools themselves are shown from then on (`_referenced`)."""
    if not isinstance(content, list):
        return content
    return [{"type": "text", "text": f"Tool loaded: {b.get('tool_name')}"}
            if isinstance(b, dict) and b.get("type") == "tool_reference" else b for b in content]


def _referenced(messages: Any) -> set[str]:
    """The tools a `tool_reference` in a tool result of `messages` names."""
    def blocks(value: Any) -> list[dict[str, Any]]:
        return [b for b in value if isinstance(b, dict)] if isinstance(value, list) else []

    results = [b for m in blocks(messages) for b in blocks(m.get("content")) if b.get("type") == "tool_result"]
    return {str(r.get("tool_name")) for b in results for r in blocks(b.get("content")) if r.get("type") == "tool_reference"}


def _functions(loaded: set[str]) -> Callable[[dict[str, Any], str], dict[str, Any] | None]:
    """A custom tool as a chat function; server tools, and deferred tools (`defer_loading`) that no tool reference
    has loaded yet, are left out (as Anthropic leaves a deferred tool out of the model's context until then)."""
    def function(tool: dict[str, Any], param: str) -> dict[str, Any] | None:
        if tool.get("type") not in (None, "custom") or (tool.get("defer_loading") and tool.get("name") not in loaded):
            return None
        if not isinstance(tool.get("input_schema"), dict):
            raise invalid(f"{param}.input_schema", "expected the tool's JSON Schema object")
        return {**keep(tool, ("name", "description")), "parameters": tool["input_schema"]}

    return function


def _tool_choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "auto":
        return None
    if kind in ("any", "none"):
        return "required" if kind == "any" else "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise invalid("tool_choice", 'expected {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or'
                                 ' {"type": "none"}')


def _stop_sequences(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise invalid("stop_sequences", "expected a list of non-empty strings")
    return value


def _response_format(config: Any) -> dict[str, Any] | None:
    """`output_config.format` (`{"type": "json_schema", "schema": ...}`) as chat's response_format; `effort` ignored."""
    fmt = format_of(config, "output_config", {"effort", "format"}, '{"effort": ..., "format": {...}}')
    if fmt is None:
        return None
    if fmt.get("type") != "json_schema" or set(fmt) - {"type", "schema"}:
        raise invalid("output_config.format", 'expected {"type": "json_schema", "schema": {...}}')
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.get("schema")}}


def translate_messages(raw: Any, *, count_only: bool = False) -> Translated:
    """The Messages body as a chat completions body (`count_only`: /v1/messages/count_tokens, no max_tokens)."""
    body = check_fields(raw, KNOWN, REFUSED)
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)
                                    or not 0 <= temperature <= 1):
        raise invalid("temperature", f"must be a number in [0, 1], got {temperature!r}")
    if not count_only and body.get("max_tokens") is None:
        raise invalid("max_tokens", "is required")
    renames: Renames = [("tool_choice.function.name", "tool_choice.name"),
                        ("response_format.json_schema", "output_config.format")]
    chat = {**keep(body, PASSED), "messages": _messages(body.get("messages"), body.get("system"))}
    if not count_only:
        chat["max_tokens"] = body["max_tokens"]
    if temperature is not None:
        chat["temperature"] = temperature
    tools = chat_tools(body.get("tools"), renames, _functions(_referenced(body.get("messages"))),
                       {"function.parameters": ".input_schema", "function": ""}, "messages")
    choice = _tool_choice(body.get("tool_choice"))
    if tools:
        chat["tools"] = tools
    if choice is not None and (tools or choice != "none"):
        chat["tool_choice"] = choice
    response_format = _response_format(body.get("output_config"))
    if response_format is not None:
        chat["response_format"] = response_format
    return Translated(chat, renames, stop=_stop_sequences(body.get("stop_sequences")), stop_param="stop_sequences")
