"""OpenAI chat `messages` -> the ChatMessages the chat template renders (400s name the offending part).

Roles system, developer, user, assistant and tool. Content is a string, null, or a list of text parts;
image, audio and file parts are refused (this server has no multimodal projector). An assistant turn's
`tool_calls` are rendered in the call format of skippy.adapter.grammar.tools, and `tool` results (consecutive ones
merged) go back as one user turn of `<tool_response>` blocks, so any chat template can carry them.
A message's `name` is accepted and not rendered (llama.cpp's templates have no place for it).
"""

from __future__ import annotations

import json
from typing import Any

from skippy.adapter.chat_template import ChatMessage
from skippy.adapter.grammar.tools import CLOSE, OPEN
from skippy.http.errors import invalid
from skippy.http.json_body import JsonBodyError, loads

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
KEYS = {"system": {"content", "name"}, "developer": {"content", "name"}, "user": {"content", "name"},
        "assistant": {"content", "name", "tool_calls", "refusal"}, "tool": {"content", "tool_call_id"}}


MEDIA_PARTS = frozenset({"image_url", "input_audio", "file", "input_image", "input_file", "image", "document"})


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


def _calls(calls: Any, param: str) -> str:
    """An assistant turn's tool calls in the call format the model is told about."""
    if not isinstance(calls, list):
        raise invalid(param, "expected a list of tool calls")
    rendered = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise invalid(f"{param}[{j}]", 'expected {"type": "function", "function": {"name": ..., "arguments": "..."}}')
        try:
            arguments = loads(fn["arguments"])
        except JsonBodyError as exc:
            raise invalid(f"{param}[{j}].function.arguments", f"is not valid JSON: {exc}") from None
        rendered.append(OPEN + json.dumps({"name": fn["name"], "arguments": arguments}, ensure_ascii=False) + CLOSE)
    return "\n".join(rendered)


def _message(message: Any, i: int) -> ChatMessage:
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
        content = "\n".join(p for p in (content, _calls(message["tool_calls"], f"{param}.tool_calls")) if p)
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise invalid(f"{param}.tool_call_id", "expected the id of the call this answers")
        content = f"<tool_response>\n{content}\n</tool_response>"
    return ChatMessage(role, content)


def parse_messages(value: Any) -> list[ChatMessage]:
    """The request's messages, tool results merged into user turns."""
    if not isinstance(value, list) or not value:
        raise invalid("messages", "expected a non-empty list of messages")
    out: list[ChatMessage] = []
    for i, raw in enumerate(value):
        msg = _message(raw, i)
        if msg.role != "tool":
            out.append(msg)
        elif out and out[-1].role == "user" and out[-1].content.endswith("</tool_response>"):
            out[-1] = ChatMessage("user", f"{out[-1].content}\n{msg.content}")
        else:
            out.append(ChatMessage("user", msg.content))
    return out


def with_system(messages: list[ChatMessage], block: str) -> list[ChatMessage]:
    """`block` appended to the leading system (or developer) message, or as a new system message."""
    if messages and messages[0].role in ("system", "developer"):
        first = messages[0]
        return [ChatMessage(first.role, f"{first.content}\n\n{block}" if first.content else block), *messages[1:]]
    return [ChatMessage("system", block), *messages]
