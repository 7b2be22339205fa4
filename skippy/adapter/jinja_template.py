"""A GGUF's `tokenizer.chat_template` rendered with Jinja, as transformers and vLLM render it.

The environment is jinja2's immutable sandbox with transformers' settings: `trim_blocks` and `lstrip_blocks`,
loop controls, a `tojson` filter that keeps non-ASCII text and takes `indent`, `separators` and `sort_keys`,
the globals `raise_exception` (a template's way to refuse a conversation) and `strftime_now`, and
`{% generation %}` blocks rendered as their body. A template is given `messages` (OpenAI's shape, an assistant's
`tool_calls` with their `arguments` as an object), `tools` (None when no tool is in play),
`add_generation_prompt`, `bos_token` and `eos_token`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
from jinja2 import nodes
from jinja2.parser import Parser


class TemplateRefused(Exception):
    """The template raised on these messages (its `raise_exception`, or an error in its expressions)."""


class _GenerationBlocks(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's text): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        return nodes.Scope(parser.parse_statements(("name:endgeneration",), drop_needle=True), lineno=lineno)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_GenerationBlocks, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class JinjaTemplate:
    """One compiled chat template (a syntax error raises jinja2.TemplateSyntaxError here, not per request)."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        env = _environment()
        self.source = source
        self.variables = jinja2.meta.find_undeclared_variables(env.parse(source))  # what the template reads
        self._template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool) -> str:
        try:
            return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except Exception as exc:  # raise_exception, undefined names, and its expressions' own (None + str, ...)
            raise TemplateRefused(f"{type(exc).__name__}: {exc}" if not isinstance(exc, jinja2.TemplateError)
                                  else str(exc)) from None
