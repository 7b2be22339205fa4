"""Generated text in the call format of skippy.adapter.grammar.tools -> content text and OpenAI tool-call deltas.

Works as the text arrives, so a stream sends the call the way OpenAI streams one: a first delta with
the call's id, type and function name (arguments ""), then argument fragments. The arguments are the
generated JSON text as is (a string, as OpenAI sends it). Leading whitespace is held until the first
other character says whether the output is a call (`<`) or text; a forced call is always a call.
Without the tags, an output that opens with the call's JSON, `{"name": NAME, "arguments": {...}}`, bare or in a
```json block, is the call too when NAME is one of the tools offered (what small models write when told the
tagged format): such a start is held until it either reads as that call's header or cannot, then it is text.
What follows a call's JSON (past its closing brace, tag or fence) is content.
A call that ends with `stop` finishes as `tool_calls`; one cut by `max_tokens` finishes as `length`
with the arguments so far, and one cut before its name was complete comes back as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

_HEADER = re.compile(r'\s*<tool_call>\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_UNTAGGED = re.compile(r'\s*(?:```(?:json)?[ \t]*\n\s*)?\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')
_CLOSER = re.compile(r"\s*\}?\s*(?:</tool_call>|```)?\s*")  # after the arguments: the call's end, then content
_UNTAGGED_STEPS = ("{", '"name"', ":", None, ",", '"arguments"', ":", "{")  # None: the quoted name


def could_open_call(text: str, names: frozenset[str]) -> bool:
    """Whether `text` can still grow into the header of an untagged call of one of `names`."""
    rest = text.lstrip()
    if rest.startswith("`"):
        fence, newline, rest = rest.partition("\n")
        tag = fence[3:].rstrip()
        if not newline:  # the fence's line is still coming
            return "```".startswith(fence) or (fence.startswith("```") and "json".startswith(tag))
        if not fence.startswith("```") or tag not in ("", "json"):
            return False
    for step in _UNTAGGED_STEPS:
        rest = rest.lstrip()
        if not rest:
            return True
        options = [json.dumps(n) for n in names] if step is None else [step]
        if any(o.startswith(rest) for o in options):
            return True
        done = next((o for o in options if rest.startswith(o)), None)
        if done is None:
            return False
        rest = rest[len(done):]
    return True


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

    def __init__(self, forced: bool, names: frozenset[str] = frozenset()) -> None:
        """`names`: the tools offered, one of which an untagged call must name (none: only tagged calls)."""
        self.state = "call" if forced else "lead"  # then "held" (maybe an untagged call), "call" or "text"
        self.names = names
        self._header = _HEADER
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
            if rest.startswith("<"):
                self.state = "call"
            elif self.names and rest[0] in "{`":
                self.state, self._header = "held", _UNTAGGED
            else:
                return self._as_text()
        if self.state == "held":
            if not could_open_call(self._buffer, self.names):
                return self._as_text()
            if self._header.match(self._buffer) is None:
                return "", []
            self.state = "call"
        return "", self._call_deltas()

    def _as_text(self) -> tuple[str, list[CallDelta]]:
        self.state = "text"
        out, self._buffer = self._buffer, ""
        return out, []

    def _call_deltas(self) -> list[CallDelta]:
        deltas = []
        if self._pos < 0:
            match = self._header.match(self._buffer)
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
        if self.state in ("lead", "held"):
            out, self._buffer = self._buffer, ""
            return out, [], finish_reason
        if self.state == "call" and self.complete and finish_reason == "stop":
            tail = self._buffer[self._pos :]
            closer = _CLOSER.match(tail)
            return tail[closer.end() if closer else 0 :], [], "tool_calls"
        return "", [], finish_reason


def merge_calls(deltas: list[CallDelta]) -> list[dict[str, object]]:
    """Streamed deltas -> the `tool_calls` of a complete (non-streamed) message."""
    if not deltas:
        return []
    head = deltas[0]
    arguments = "".join(d.arguments for d in deltas)
    return [{"id": head.call_id, "type": "function", "function": {"name": head.name, "arguments": arguments}}]
