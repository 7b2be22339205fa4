"""Generated text in the call format of skippy.adapter.grammar.tools -> content text and OpenAI tool-call deltas.

Works as the text arrives, so a stream sends the call the way OpenAI streams one: a first delta with
the call's id, type and function name (arguments ""), then argument fragments. The arguments are the
generated JSON text as is (a string, as OpenAI sends it). Leading whitespace is held until the first
other character says whether the output is a call (`<`) or text; a forced call is always a call.
A call that ends with `stop` finishes as `tool_calls`; one cut by `max_tokens` finishes as `length`
with the arguments so far, and one cut before its name was complete comes back as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

_HEADER = re.compile(r'\s*<tool_call>\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass
class CallDelta:
    """One streamed piece of tool call 0: the header (id and name set) or an arguments fragment."""

    arguments: str
    call_id: str | None = None
    name: str | None = None

    def to_json(self) -> dict[str, object]:
        if self.call_id is None:
            return {"index": 0, "function": {"arguments": self.arguments}}
        return {"index": 0, "id": self.call_id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class ToolCallReader:
    """Feed text deltas with `push`; `finish` at the end. Each returns (content text, call deltas)."""

    def __init__(self, forced: bool) -> None:
        self.state = "call" if forced else "lead"
        self._buffer = ""
        self._pos = -1  # where the arguments start in the buffer, once the header is read
        self._depth, self._in_string, self._escaped = 0, False, False
        self.complete = False  # the arguments object is closed

    def push(self, text: str) -> tuple[str, list[CallDelta]]:
        if self.state == "text":
            return text, []
        self._buffer += text
        if self.state == "lead":
            rest = self._buffer.lstrip()
            if not rest:
                return "", []
            if not rest.startswith("<"):
                self.state = "text"
                out, self._buffer = self._buffer, ""
                return out, []
            self.state = "call"
        return "", self._call_deltas()

    def _call_deltas(self) -> list[CallDelta]:
        deltas = []
        if self._pos < 0:
            match = _HEADER.match(self._buffer)
            if match is None:
                return []
            self._pos = match.end()
            name = json.loads(f'"{match.group(1)}"')
            deltas.append(CallDelta("", f"call_{uuid.uuid4().hex[:24]}", name))
        while self._depth == 0 and self._buffer[self._pos : self._pos + 1].isspace():
            self._pos += 1  # the grammar's optional space before the arguments object is not part of it
        start = self._pos
        while self._pos < len(self._buffer) and not self.complete:
            self._scan(self._buffer[self._pos])
            self._pos += 1
        if self._pos > start:
            deltas.append(CallDelta(self._buffer[start : self._pos]))
        return deltas

    def _scan(self, ch: str) -> None:
        """Track the arguments object's nesting (strings skipped) to see where it closes."""
        if self._in_string:
            self._escaped, self._in_string = (False, True) if self._escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            self.complete = self._depth == 0

    def finish(self, finish_reason: str) -> tuple[str, list[CallDelta], str]:
        """Whatever is left, and the finish reason to report (`tool_calls` for a complete call)."""
        if self.state == "call" and self._pos < 0:  # cut before the call's name: give back the text
            out, self._buffer = self._buffer, ""
            return out, [], finish_reason
        if self.state == "lead":
            out, self._buffer = self._buffer, ""
            return out, [], finish_reason
        if self.state == "call" and self.complete and finish_reason == "stop":
            return "", [], "tool_calls"
        return "", [], finish_reason


def merge_calls(deltas: list[CallDelta]) -> list[dict[str, object]]:
    """Streamed deltas -> the `tool_calls` of a complete (non-streamed) message."""
    if not deltas:
        return []
    head = deltas[0]
    arguments = "".join(d.arguments for d in deltas)
    return [{"id": head.call_id, "type": "function", "function": {"name": head.name, "arguments": arguments}}]
