"""`response_format` and tools -> the one GBNF grammar the final stage samples under (or None).

`{"type": "text"}` (or none): free text. `{"type": "json_object"}`: any JSON object (llama-server's
extension `{"type": "json_object", "schema": {...}}` takes a schema too). `{"type": "json_schema",
"json_schema": {"name", "description", "schema", "strict"}}`: that schema. With `strict: true` the output
parses and validates whenever it ends with finish_reason `stop` (`max_tokens` can still cut it:
`length`), and a schema the grammar cannot enforce exactly is a 400 naming the part
(skippy.adapter.grammar.json_schema). Without it, and always for tools' parameters, what the grammar
cannot enforce is relaxed (generated without that constraint) and logged once per keyword per process
(`schema_keywords_relaxed`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from skippy.adapter.grammar.json_schema import GrammarBuilder, SchemaError
from skippy.adapter.grammar.tools import FREE_TEXT, ToolPlan, add_call_rules
from skippy.http.errors import invalid
from skippy.log import get_logger
from skippy.runtime.grammar_sampler import MAX_GRAMMAR_BYTES

_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}
_JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}
RELAXED_LOGGED: set[str] = set()  # keywords already logged as relaxed by this process


class ResponseSchema(NamedTuple):
    schema: Any
    param: str  # names it in errors
    strict: bool  # refuse what the grammar cannot enforce, rather than relax it


def response_schema(value: Any) -> ResponseSchema | None:
    """The schema `response_format` asks for and the param naming it; None for free text."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _FORMAT_KEYS:
        raise invalid("response_format.type", f'expected "text", "json_object" or "json_schema", got {kind!r}')
    unknown = sorted(set(value) - _FORMAT_KEYS[kind])
    if unknown:
        raise invalid(f"response_format.{unknown[0]}", f"unknown field for type {kind}")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseSchema(value.get("schema") or {"type": "object"}, "response_format.schema", False)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema", "expected an object with name and schema")
    unknown = sorted(set(spec) - _JSON_SCHEMA_KEYS)
    if unknown:
        raise invalid(f"response_format.json_schema.{unknown[0]}", "unknown field")
    for key, kinds in (("name", str), ("description", str), ("strict", bool)):
        if spec.get(key) is not None and not isinstance(spec[key], kinds):
            raise invalid(f"response_format.json_schema.{key}", f"expected a {kinds.__name__}")
    return ResponseSchema(spec.get("schema") or {"type": "object"}, "response_format.json_schema.schema",
                          spec.get("strict") is True)


def build_grammar(response: ResponseSchema | None, plan: ToolPlan | None) -> str | None:
    """The grammar for structured output and/or a tool call; None when the output is free text."""
    if response is None and plan is None:
        return None
    builder = GrammarBuilder()
    try:
        content = None if response is None else builder.rule_for(response.schema, "response", response.param,
                                                                  relax=not response.strict)
        if plan is not None:
            builder.add("tool-call", add_call_rules(builder, plan))
    except SchemaError as exc:
        raise invalid(exc.param, exc.detail, "unsupported_schema") from None
    _log_relaxed(builder.relaxed)
    if plan is None:
        assert content is not None and response is not None
        return _sized(builder.grammar(content), response.param)
    if plan.forced:
        return _sized(builder.grammar("tool-call"), "tools")
    if content is None:
        builder.add("free-text", FREE_TEXT)
    return _sized(builder.grammar(f"[ \\t\\n]* (tool-call | {content or 'free-text'})"), "tools")


def _log_relaxed(relaxed: dict[str, str]) -> None:
    for keyword, where in relaxed.items():
        if keyword not in RELAXED_LOGGED:
            RELAXED_LOGGED.add(keyword)
            get_logger().info("schema_keywords_relaxed", keyword=keyword, where=where)


def _sized(grammar: str, param: str) -> str:
    size = len(grammar.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise invalid(param, f"the schema makes a grammar of {size} bytes, over {MAX_GRAMMAR_BYTES}", "unsupported_schema")
    return grammar
