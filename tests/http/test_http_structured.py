"""The request side of structured output and tools, without a server: schemas -> grammars llama.cpp parses
(or 400s naming the part), safe patterns, the field audit, messages with tool turns, and reading tool calls."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skippy.adapter.chat_messages import flat_messages, parse_messages
from skippy.adapter.chat_template import ChatTemplate
from skippy.adapter.grammar.json_schema import GrammarBuilder, SchemaError
from skippy.adapter.grammar.schema_pattern import PatternError, safe_pattern
from skippy.adapter.grammar.tool_output import ToolCallReader, merge_calls
from skippy.adapter.openai_request import parse_generation
from skippy.http.errors import HttpError
from skippy.runtime.grammar_sampler import check_grammar
from skippy.runtime.tokenizer import Tokenizer

PET = {"type": "object", "required": ["kind", "owner", "tags"], "additionalProperties": False, "properties": {
    "kind": {"enum": ["cat", "dog"], "description": "which"},
    "owner": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
              "required": ["name"]},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,5}(-\\d)?$"}, "maxItems": 3},
    "born": {"type": "string", "format": "date"}, "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "tree": {"$ref": "#/$defs/Node"}},
    "$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Callable[..., Path]) -> Iterator[Tokenizer]:
    tok = Tokenizer(tiny_model("llama"))
    yield tok
    tok.close()


def grammar_for(schema: Any) -> str:
    builder = GrammarBuilder()
    return builder.grammar(builder.rule_for(schema, "response", "schema"))


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def refusal(body: dict[str, Any], kind: str = "chat") -> HttpError:
    with pytest.raises(HttpError) as info:
        parse_generation(body, kind, "m")
    assert info.value.status == 400
    return info.value


def test_supported_schemas_become_grammars_llama_cpp_parses(tokenizer: Tokenizer) -> None:
    for schema in (PET, {"type": "object"}, True, {"type": ["string", "null"]}, {"const": 3},
                   {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]}):
        check_grammar(tokenizer.vocab, grammar_for(schema))
    assert 'char ::= [^"\\\\\\x7F\\x00-\\x1F]' in grammar_for({"type": "string"})  # no raw control characters


@pytest.mark.parametrize("schema, param", [
    ({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}, "s.properties.age.minimum"),
    ({"oneOf": [{"type": "string"}]}, "s.oneOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "s.uniqueItems"),
    ({"type": "object", "properties": {}, "required": ["x"]}, "s.required"),
    ({"type": "string", "format": "email"}, "s.format"),
    ({"type": "string", "pattern": "^a.b$"}, "s.pattern"),
    ({"$ref": "https://example.com/s.json"}, "s.$ref"),
    ({"enum": ["a", 1], "type": "string"}, "s.enum"),
    ({"type": "integer", "enum": [1], "minimum": 0}, "s.minimum"),
    ({"type": "wat"}, "s.type"),
])
def test_unsupported_parts_are_named(schema: Any, param: str) -> None:
    with pytest.raises(SchemaError) as info:
        GrammarBuilder().rule_for(schema, "r", "s")
    assert info.value.param == param


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}, "minimum"),
    ({"oneOf": [{"type": "string"}]}, "oneOf"), ({"anyOf": [{"type": "string"}], "type": "string"}, "type"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 1}, "minItems"),
    ({"type": "string", "format": "email"}, "format"), ({"type": "string", "pattern": "^a.b$"}, "pattern"),
    ({"type": "string", "format": "date", "maxLength": 10}, "maxLength"), ({"exclusiveMaximum": 3}, "exclusiveMaximum"),
    ({"type": ["string", "null"], "minLength": 2}, "minLength"), ({"type": "string", "maxLength": 10_001}, "maxLength"),
])
def test_relaxed_parts_are_recorded_not_refused(tokenizer: Tokenizer, schema: Any, keyword: str) -> None:
    builder = GrammarBuilder()
    check_grammar(tokenizer.vocab, builder.grammar(builder.rule_for(schema, "r", "s", relax=True)))
    assert list(builder.relaxed) == [keyword]
    for malformed in ({"type": "wat"}, {"type": "object", "properties": {}, "required": ["x"]}, {"$ref": "http://x"}):
        with pytest.raises(SchemaError):
            GrammarBuilder().rule_for(malformed, "r", "s", relax=True)


@pytest.mark.parametrize("pattern, expected", [
    ("^[a-z]{2,5}$", "^([a-z]{2,5})$"), ("\\d+\\.\\d*", "^([0-9]+[.][0-9]*)$"), ("^(ab|cd)?x$", "^((ab|cd)?x)$"),
    ("[A-Z_-]", "^([A-Z_-])$"), ("\\w", "^([0-9A-Z_a-z])$"),
])
def test_safe_patterns(pattern: str, expected: str) -> None:
    assert safe_pattern(pattern) == expected


@pytest.mark.parametrize("pattern", [".*", "[^a]", "\\s", '"', "(?=a)", "[ -~]", "a{3,1}", "\\1", "[a"])
def test_unsafe_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(PatternError):
        safe_pattern(pattern)


@pytest.mark.parametrize("body, param", [
    (chat(audio={"voice": "x"}), "audio"), (chat(n=2), "n"), (chat(functions=[]), "functions"),
    (chat(reasoning_effort="low"), "reasoning_effort"), (chat(modalities=["text", "audio"]), "modalities"),
    (chat(store=True), "store"), (chat(prediction={"type": "content", "content": "x"}), "prediction"),
    (chat(stream_options={"wat": 1}), "stream_options.wat"),
    (chat(response_format={"type": "json_object"}, stop=["}"]), "stop"),
    (chat(response_format={"type": "json_object"}, ignore_eos=True), "ignore_eos"),
    (chat(response_format={"type": "xml"}), "response_format.type"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
    (chat(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools[0].type"),
    (chat(tools=[{**TOOL, "function": {**TOOL["function"], "parameters": {"type": "object", "properties": {
        "n": {"type": "wat", "maximum": 3}}}}}]), "tools[0].function.parameters.properties.n.type"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0]"),
    ({"model": "m", "prompt": "x", "tools": [TOOL]}, "tools"), ({"model": "m", "prompt": "x", "echo": True}, "echo"),
])
def test_refused_fields_are_named(body: dict[str, Any], param: str) -> None:
    kind = "completion" if "prompt" in body else "chat"
    assert refusal(body, kind).param == param


def test_a_schema_too_large_for_the_wire_is_refused() -> None:
    huge = {"type": "object", "properties": {f"p{i}": {"enum": [f"value-{i}-{j}" for j in range(60)]}
                                             for i in range(200)}}
    error = refusal(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": huge}}))
    assert error.param == "response_format.json_schema.schema" and "bytes" in error.message


def test_completion_prompt_as_token_ids() -> None:
    assert parse_generation({"model": "m", "prompt": [1, 5, 9]}, "completion", "m").prompt_ids == [1, 5, 9]
    assert refusal({"model": "m", "prompt": [[1], [2]]}, "completion").param == "prompt"


def test_meaningless_fields_are_accepted() -> None:
    req = parse_generation(chat(user="u", metadata={"a": "b"}, store=False, service_tier="auto", safety_identifier="s",
                                prompt_cache_key="k", parallel_tool_calls=False, modalities=["text"]), "chat", "m")
    assert req.sampling.grammar is None and req.tools is None


def test_tools_are_told_and_constrained(tokenizer: Tokenizer) -> None:
    forced = parse_generation(chat(tools=[TOOL], tool_choice="required"), "chat", "m")
    assert forced.tools is not None and forced.tools.forced
    template = ChatTemplate(tokenizer.model, "llama")  # no template in the GGUF: llama.cpp's, given skippy's tools prompt
    assert template.source == "builtin" and not template.native_tools
    prompt = template.apply(forced.messages, tools=forced.tools)
    assert "<tools>" in prompt and "get_weather" in prompt and "Call the function get_weather now." in prompt
    assert "get_weather" not in template.apply(forced.messages)
    assert forced.sampling.grammar is not None and "root ::= tool-call" in forced.sampling.grammar
    auto = parse_generation(chat(tools=[TOOL]), "chat", "m")
    assert auto.tools is not None and not auto.tools.forced and "free-text" in (auto.sampling.grammar or "")
    none = parse_generation(chat(tools=[TOOL], tool_choice="none"), "chat", "m")
    assert none.tools is None and none.sampling.grammar is None and none.messages[0].role == "user"


def test_tool_turns_go_back_to_the_template() -> None:
    """For a template that does not know tool turns: written as text in the tagged call format."""
    messages = flat_messages(parse_messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "13 C"}]))
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[1].content == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert messages[2].content == "<tool_response>\n12 C\n</tool_response>\n<tool_response>\n13 C\n</tool_response>"


def read(reader: ToolCallReader, pieces: list[str], finish: str) -> tuple[str, list[Any], str]:
    text, deltas = "", []
    for piece in pieces:
        out, calls = reader.push(piece)
        text, deltas = text + out, deltas + calls
    tail, calls, reason = reader.finish(finish)
    return text + tail, deltas + calls, reason


def test_a_call_is_read_as_it_streams() -> None:
    generated = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "O}{\\"slo"} }\n</tool_call>'
    text, deltas, reason = read(ToolCallReader(forced=True), list(generated), "stop")
    assert text == "" and reason == "tool_calls"
    assert deltas[0].name == "get_weather" and deltas[0].call_id and deltas[0].arguments == ""
    (call,) = merge_calls(deltas)
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "O}{\\"slo"}'}


def test_text_and_cut_calls() -> None:
    assert read(ToolCallReader(forced=False), ["\n", " Hel", "lo"], "stop") == ("\n Hello", [], "stop")
    text, deltas, reason = read(ToolCallReader(forced=False), [" <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a"],
                                "length")
    assert text == "" and reason == "length" and "".join(d.arguments for d in deltas) == '{"a'
    assert read(ToolCallReader(forced=True), ["<tool_call>\n{\"na"], "length") == ('<tool_call>\n{"na', [], "length")


@pytest.mark.parametrize("generated", [
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    '{\n  "name": "get_weather",\n  "arguments": {"city": "Oslo"}\n}\n```',
    '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```\n',
    '```\n{"name":"get_weather","arguments":{"city": "Oslo"}}\n```'])
def test_an_untagged_call_of_an_offered_tool_is_a_call(generated: str) -> None:
    for pieces in (list(generated), [generated]):  # token by token, and at once
        text, deltas, reason = read(ToolCallReader(forced=False, names=frozenset({"get_weather"})), pieces, "stop")
        assert (text, reason) == ("", "tool_calls")
        (call,) = merge_calls(deltas)
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


@pytest.mark.parametrize("generated", [
    '{"name": "get_time", "arguments": {}}',  # not an offered tool
    '{"name": "get_weather", "arguments": "Oslo"}',  # arguments not an object
    '{"city": "Oslo"}', '```python\nprint("{}")\n```', "`get_weather`", '```json\n[1, 2]\n```', "{", "```js"])
def test_text_that_is_not_a_call_stays_text(generated: str) -> None:
    for pieces in (list(generated), [generated]):
        assert read(ToolCallReader(forced=False, names=frozenset({"get_weather"})), pieces, "stop") == (
            generated, [], "stop")
    assert read(ToolCallReader(forced=False), ['{"name": "get_weather", "arguments": {}}'], "stop") == (
        '{"name": "get_weather", "arguments": {}}', [], "stop")  # no tools named: only tagged calls


def test_text_after_an_untagged_call_is_content() -> None:
    text, deltas, reason = read(ToolCallReader(forced=False, names=frozenset({"get_weather"})),
                                list('{"name": "get_weather", "arguments": {}}\nChecking now.'), "stop")
    assert (text, reason, merge_calls(deltas)[0]["function"]["arguments"]) == ("Checking now.", "tool_calls", "{}")
