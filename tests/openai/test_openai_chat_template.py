"""The model's own chat template (skippy.adapter.chat_template), rendered with Jinja as transformers renders it.

In process on the real GGUFs: Qwen2.5-Coder-0.5B-Instruct's template given the tools and the tool turns as they
are (its output is transformers' for the same conversation), SmolLM2's ChatML template (no tools in it: skippy's
tools prompt and the tool turns as text), a GGUF without a template (llama.cpp's built-in one, as before).
Through `skippy up` on a tiny llama given a small template: the tools, tool calls and tool results reach the
template, BOS is not doubled, and a template that raises on a conversation is a 400 naming `messages`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from up_helpers import SkippyServer

from skippy.adapter.chat_messages import parse_messages
from skippy.adapter.chat_template import ChatTemplate
from skippy.adapter.grammar.tools import parse_tools
from skippy.http.errors import HttpError
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer
from skippy.testing.tiny_models import BOS_ID

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOL_TURNS: Any = [
    {"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Zürich"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "12 C"}]
# Qwen2.5's template on TOOL_TURNS with WEATHER, as transformers 5.25 renders it (render_jinja_template, the call's
# arguments an object): checked once by hand against it
QWEN_TOOL_PROMPT = (
    "<|im_start|>system\nbe brief\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nweather in Zürich?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n12 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
# the tiny model's template: the tools, each turn, an assistant's calls and a tool result's id and name, and a
# refusal of the word "forbidden"; it writes BOS itself
TINY_TEMPLATE = """{{ bos_token }}{% if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>{% endif %}
{% for message in messages %}
{% if message.content == 'forbidden' %}{{ raise_exception('the word forbidden is not allowed') }}{% endif %}
<|{{ message.role }}|>{% generation %}{{ message.content }}{% endgeneration %}
{% for call in message.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}
{% if message.role == 'tool' %}[{{ message.name }}#{{ message.tool_call_id }}]{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""


@contextmanager
def template_of(path: Path) -> Iterator[ChatTemplate]:
    tokenizer = Tokenizer(path)
    try:
        yield ChatTemplate(tokenizer.model, read_model_info(path).architecture)
    finally:
        tokenizer.close()


def render(template: ChatTemplate, messages: Any, tools: list[Any] | None = None) -> str:
    return template.apply(parse_messages(messages), tools=parse_tools({"tools": tools}) if tools else None)


@pytest.mark.gemma
def test_qwen_template_is_given_the_tools_and_the_tool_turns(qwen05b_path: Path) -> None:
    with template_of(qwen05b_path) as template:
        assert (template.source, template.engine, template.native_tools) == ("gguf", "jinja", True)
        assert render(template, TOOL_TURNS, [WEATHER]) == QWEN_TOOL_PROMPT
        plain = render(template, [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}])
        assert plain == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert "<tools>" not in render(template, TOOL_TURNS)  # tool_choice none: no tools, the turns still native


@pytest.mark.gemma
def test_smollm2_chatml_template_gets_skippys_tools_prompt(smollm2_path: Path) -> None:
    with template_of(smollm2_path) as template:
        assert (template.source, template.engine, template.native_tools) == ("gguf", "jinja", False)
        assert render(template, [{"role": "user", "content": "hi"}]) == (
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")  # its own default system turn
        prompt = render(template, TOOL_TURNS, [WEATHER])
        assert prompt.startswith("<|im_start|>system\nbe brief\n\n# Tools\n") and "<tools>\n{" in prompt
        assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
                "</tool_call><|im_end|>") in prompt
        assert "<|im_start|>user\n<tool_response>\n12 C\n</tool_response><|im_end|>" in prompt


def test_a_gguf_without_a_template_keeps_llama_cpps_builtin(tiny_model: Callable[..., Path]) -> None:
    with template_of(tiny_model("llama")) as template:
        assert (template.source, template.engine, template.native_tools) == ("builtin", "llama.cpp", False)
        assert template.template == b"llama3"
        prompt = render(template, TOOL_TURNS, [WEATHER])
        assert prompt.startswith("<|start_header_id|>system<|end_header_id|>\n\nbe brief\n\n# Tools")
        assert "<tool_response>\n12 C\n</tool_response>" in prompt


def with_template(model: Path, template: str, folder: Path) -> Path:
    """A copy of `model` with `template` as its `tokenizer.chat_template` (gguf's own metadata copier)."""
    (folder / "template.jinja").write_text(template)
    out = folder / "templated.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(model), str(out),
                    "--chat-template-file", str(folder / "template.jinja"), "--force"], check=True, capture_output=True)
    return out


def test_a_template_jinja_cannot_compile_goes_to_llama_cpps_matcher(tiny_model: Callable[..., Path],
                                                                     tmp_path: Path) -> None:
    broken = "{% if %}<|im_start|>{{ message['role'] }}"  # a syntax error; llama.cpp still knows ChatML by its tokens
    with template_of(with_template(tiny_model("llama"), broken, tmp_path)) as template:
        assert (template.source, template.engine, template.native_tools) == ("gguf", "llama.cpp", False)
        assert render(template, [{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def templated_llama(tiny_model: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with TINY_TEMPLATE as its `tokenizer.chat_template`."""
    return with_template(tiny_model("llama"), TINY_TEMPLATE, tmp_path_factory.mktemp("templated"))


@pytest.fixture(scope="module")
def templated_server(start_up: Callable[..., Any], templated_llama: Path) -> Iterator[SkippyServer]:
    with start_up("up-templated", templated_llama) as s:
        yield s


def test_a_raising_template_is_a_400_in_process(templated_llama: Path) -> None:
    with template_of(templated_llama) as template:
        with pytest.raises(HttpError) as err:
            render(template, [{"role": "user", "content": "forbidden"}])
        assert err.value.status == 400 and err.value.param == "messages"


def test_the_tiny_template_gets_tools_calls_and_results(templated_server: SkippyServer) -> None:
    props = templated_server.request("GET", "/props").json()
    assert props["chat_template_source"] == "gguf" and props["chat_template_engine"] == "jinja"
    assert props["chat_template_caps"] == {"supports_tools": True, "supports_tool_calls": True}
    assert props["chat_template"] == TINY_TEMPLATE
    r = templated_server.request("POST", "/apply-template", {"messages": TOOL_TURNS, "tools": [WEATHER]})
    assert r.status == 200, r.body
    assert r.json()["prompt"] == (
        '<tools>{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}</tools>'
        "<|system|>be brief<|user|>weather in Zürich?<|assistant|>"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>'
        "<|tool|>12 C[get_weather#c1]<|assistant|>")  # the BOS it writes is the tokenizer's to add


def test_the_prompt_has_one_bos(templated_server: SkippyServer) -> None:
    r = templated_server.request("POST", "/tokenize", {"messages": [{"role": "user", "content": "hello world"}]})
    tokens = r.json()["tokens"]
    assert tokens[0] == BOS_ID and BOS_ID not in tokens[1:]


@pytest.mark.parametrize("stream", [False, True])
def test_a_template_that_raises_is_a_400_naming_messages(templated_server: SkippyServer, stream: bool) -> None:
    r = templated_server.request("POST", "/v1/chat/completions", {
        "model": templated_server.model_id, "stream": stream, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "forbidden"}]})
    assert r.status == 400, r.body
    error = r.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert error["message"] == ("messages: the model's chat template refused these messages: "
                                "the word forbidden is not allowed")
    assert templated_server.request("POST", "/apply-template", {"messages": [
        {"role": "user", "content": "forbidden"}]}).status == 400
    ok = templated_server.request("POST", "/v1/chat/completions", {
        "model": templated_server.model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]})
    assert ok.status == 200, ok.body
