"""OpenAI `tools` / `tool_choice` -> what the model is told, and the grammar its call is generated under.

The call format is the Hermes / Qwen 2.5 one: a call is `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`.
A chat template written for that format is given the tools itself (skippy.adapter.chat_template); any other is
given `tools_prompt`: the tools listed in the system message inside `<tools></tools>`, a tool's result going back
to the model as a user turn `<tool_response>\\n...\\n</tool_response>` (skippy.adapter.chat_messages).

- `tool_choice` `"required"` or `{"type": "function", "function": {"name": N}}`: the output is one call,
  forced by a grammar built from the functions' `parameters` schemas, so it always parses and its
  arguments validate against what the grammar enforces (a keyword it cannot is relaxed, never refused).
- `"auto"` (the default when tools are given): the grammar lets the output be either one such call or
  text that does not start with `<` (or, with `response_format`, that JSON); text that opens with the call's
  JSON naming an offered tool, bare or in a ```json block, is read as the call (skippy.adapter.grammar.tool_output).
- `"none"`: the tools are not shown and no call is made.
One call per response at most (`parallel_tool_calls` is accepted either way).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from skippy.adapter.grammar.json_schema import GrammarBuilder, SchemaError
from skippy.http.errors import invalid

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
FREE_TEXT = r"([^<\x00 \t\n\r] [^\x00]*)?"  # text that cannot be mistaken for a call


@dataclass(frozen=True)
class Tool:
    index: int  # in the request's `tools`
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """The tools in play: `forced` (required / named) or auto; `tools` are those the call may use."""

    tools: tuple[Tool, ...]
    forced: bool


def _tool(value: Any, i: int) -> Tool:
    param = f"tools[{i}]"
    if not isinstance(value, dict) or value.get("type") != "function":
        kind = value.get("type") if isinstance(value, dict) else None
        raise invalid(f"{param}.type", f"only function tools are supported, got {kind!r}")
    unknown = sorted(set(value) - {"type", "function"})
    if unknown:
        raise invalid(f"{param}.{unknown[0]}", "unknown field")
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise invalid(f"{param}.function", "expected an object with name and parameters")
    unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise invalid(f"{param}.function.{unknown[0]}", "unknown field")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(f"{param}.function.name", f"expected 1-64 of a-z, A-Z, 0-9, _ and -, got {name!r}")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict) or params.get("type") != "object":
        raise invalid(f"{param}.function.parameters", 'must be a JSON Schema with "type": "object"')
    if fn.get("strict") is not None and not isinstance(fn.get("strict"), bool):
        raise invalid(f"{param}.function.strict", "expected true or false")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise invalid(f"{param}.function.description", "expected a string")
    return Tool(i, name, description, params)


def parse_tools(body: dict[str, Any]) -> ToolPlan | None:
    """`tools` and `tool_choice` checked; None when no tool may be called."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None:
        if choice not in (None, "none"):
            raise invalid("tool_choice", "needs tools")
        return None
    if not isinstance(raw, list) or not raw:
        raise invalid("tools", "expected a non-empty list of function tools")
    tools = tuple(_tool(t, i) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise invalid("tools", "function names must be unique")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "expected true or false")
    if choice is None or choice == "auto":
        return ToolPlan(tools, forced=False)
    if choice == "none":
        return None
    if choice == "required":
        return ToolPlan(tools, forced=True)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        chosen = tuple(t for t in tools if t.name == name)
        if not chosen:
            raise invalid("tool_choice.function.name", f"{name!r} is not one of the tools ({', '.join(names)})")
        return ToolPlan(chosen, forced=True)
    raise invalid("tool_choice", 'expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')


def tools_prompt(plan: ToolPlan) -> str:
    """The system-message block that tells the model its tools and the call format."""
    listed = "\n".join(json.dumps({"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}}, ensure_ascii=False)
        for t in plan.tools)
    lines = ["# Tools", "", "You may call one of these functions to assist with the user query.", "",
             "You are provided with function signatures within <tools></tools> XML tags:",
             f"<tools>\n{listed}\n</tools>", "",
             "For a function call, return a json object with the function name and arguments within"
             " <tool_call></tool_call> XML tags:",
             '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>']
    if plan.forced:
        lines.append(f"\nCall {'the function ' + plan.tools[0].name if len(plan.tools) == 1 else 'one function'} now.")
    return "\n".join(lines)


def _literal(text: str) -> str:
    return json.dumps(text)  # a GBNF string literal: JSON escapes are GBNF escapes for these characters


def add_call_rules(builder: GrammarBuilder, plan: ToolPlan) -> str:
    """Rules for one call to any of the plan's tools; returns the call rule's body."""
    alternatives = []
    for tool in plan.tools:
        wrapper = {"type": "object", "required": ["name", "arguments"],
                   "properties": {"name": {"const": tool.name}, "arguments": tool.parameters}}
        path = f"tools[{tool.index}].function"
        wrapped, unwrapped = f"{path}.properties.arguments", f"{path}.parameters"
        try:
            alternatives.append(builder.rule_for(wrapper, f"call{tool.index}", path, relax=True))
        except SchemaError as exc:  # name the tool's parameters, not the wrapper around them
            raise SchemaError(exc.param.replace(wrapped, unwrapped), exc.detail) from None
        builder.relaxed.update({k: v.replace(wrapped, unwrapped) for k, v in builder.relaxed.items()})
    return f"{_literal(OPEN)} ({' | '.join(alternatives)}) {_literal(CLOSE)}"
