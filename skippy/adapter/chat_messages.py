"""OpenAI chat `messages` -> the ChatMessages the chat template renders (400s name the offending part).

Roles system, developer, user, assistant and tool. Content is a string, null, or a list of text parts;
image, audio and file parts are refused (this server has no multimodal projector). An assistant turn's
`tool_calls` (their `arguments` parsed: JSON text, an object once parsed) and a `tool` result (the call it
answers, its function's name) are kept as such: a chat template that knows tool turns renders them itself
(skippy.adapter.chat_template). For one that does not, `flat_messages` writes them as text in the call format
of skippy.adapter.grammar.tools, tool results (consecutive ones merged) going back as one user turn of
`<tool_response>` blocks, so any chat template can carry them.
A message's `name` is accepted and not rendered (chat templates have no place for it), but a tool result's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from skippy.adapter.grammar.tools import CLOSE, OPEN
from skippy.http.errors import invalid
from skippy.http.json_body import JsonBodyError, loads

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
KEYS = {"system": {"content", "name"}, "developer": {"content", "name"}, "user": {"content", "name"},
        "assistant": {"content", "name", "tool_calls", "refusal"}, "tool": {"content", "tool_call_id", "name"}}


MEDIA_PARTS = frozenset({"image_url", "input_audio", "file", "input_image", "input_file", "image", "document"})


@dataclass(frozen=True)
class ToolCallTurn:
    """One call an assistant turn made: `arguments` is its parsed JSON (an object, as chat templates expect)."""

    call_id: str
    name: str
    arguments: Any


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCallTurn, ...] = ()  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool result: the called function's name


def text_parts(value: Any, param: str, kinds: tuple[str, ...]) -> str:
    """A string, or a list of text parts of `kinds` (`{"type": KIND, "text": ...}`; a `refusal` part's text is
    its `refusal`) joined; image, audio and file parts are a 400 saying why, anything else a 400 too.
    Also used by the Responses and Anthropic translations, with their part kinds."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(param, f"expected a string or a list of {kinds[0]} parts, got {type(value).__name__}")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise invalid(f"{param}[{j}]", f"{kind} parts need a multimodal projector; this server takes text only")
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(text, str):
            raise invalid(f"{param}[{j}]", f'expected a text part {{"type": "{kinds[0]}", "text": ...}}')
        texts.append(text)
    return "".join(texts)


def _calls(calls: Any, param: str) -> tuple[ToolCallTurn, ...]:
    if not isinstance(calls, list):
        raise invalid(param, "expected a list of tool calls")
    turns = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise invalid(f"{param}[{j}]", 'expected {"type": "function", "function": {"name": ..., "arguments": "..."}}')
        try:
            arguments = loads(fn["arguments"])
        except JsonBodyError as exc:
            raise invalid(f"{param}[{j}].function.arguments", f"is not valid JSON: {exc}") from None
        call_id = call.get("id")
        turns.append(ToolCallTurn(call_id if isinstance(call_id, str) else "", fn["name"], arguments))
    return tuple(turns)


def _message(message: Any, i: int, called: dict[str, str]) -> ChatMessage:
    """Message `i`; `called` maps the call ids seen so far to their function's name."""
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid(param, "expected an object with role and content")
    role = message.get("role")
    if role not in ROLES:
        hint = " (function messages are deprecated: use tool)" if role == "function" else ""
        raise invalid(f"{param}.role", f"expected one of {sorted(ROLES)}, got {role!r}{hint}")
    unknown = sorted(k for k in set(message) - KEYS[role] - {"role"} if message[k] is not None)
    if unknown:
        raise invalid(f"{param}.{unknown[0]}", f"not supported on a {role} message")
    raw = message.get("content")
    content = "" if raw is None else text_parts(raw, f"{param}.content", ("text", "refusal"))
    if role == "assistant" and message.get("tool_calls"):
        calls = _calls(message["tool_calls"], f"{param}.tool_calls")
        called.update((c.call_id, c.name) for c in calls)
        return ChatMessage(role, content, tool_calls=calls)
    if role == "tool":
        call_id, name = message.get("tool_call_id"), message.get("name")
        if not isinstance(call_id, str):
            raise invalid(f"{param}.tool_call_id", "expected the id of the call this answers")
        if name is not None and not isinstance(name, str):
            raise invalid(f"{param}.name", "expected the called function's name")
        return ChatMessage(role, content, tool_call_id=call_id, name=name or called.get(call_id))
    return ChatMessage(role, content)


def parse_messages(value: Any) -> list[ChatMessage]:
    """The request's messages, checked."""
    if not isinstance(value, list) or not value:
        raise invalid("messages", "expected a non-empty list of messages")
    called: dict[str, str] = {}
    return [_message(raw, i, called) for i, raw in enumerate(value)]


def flat_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Tool turns as text in the call format of skippy.adapter.grammar.tools, tool results merged into user turns."""
    out: list[ChatMessage] = []
    for msg in messages:
        if msg.tool_calls:
            calls = "\n".join(OPEN + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) + CLOSE
                              for c in msg.tool_calls)
            out.append(ChatMessage(msg.role, "\n".join(p for p in (msg.content, calls) if p)))
        elif msg.role != "tool":
            out.append(msg)
        elif out and out[-1].role == "user" and out[-1].content.endswith("</tool_response>"):
            out[-1] = ChatMessage("user", f"{out[-1].content}\n<tool_response>\n{msg.content}\n</tool_response>")
        else:
            out.append(ChatMessage("user", f"<tool_response>\n{msg.content}\n</tool_response>"))
    return out


def with_system(messages: list[ChatMessage], block: str) -> list[ChatMessage]:
    """`block` appended to the leading system (or developer) message, or as a new system message."""
    if messages and messages[0].role in ("system", "developer"):
        first = messages[0]
        return [ChatMessage(first.role, f"{first.content}\n\n{block}" if first.content else block), *messages[1:]]
    return [ChatMessage("system", block), *messages]
