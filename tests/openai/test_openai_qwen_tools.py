"""A tool call end to end on Qwen2.5-Coder-0.5B-Instruct (`skippy up --model PATH`), its own chat template given
the tools: with `tool_choice` auto the model's call comes back as `tool_calls` (streamed too), and the next turn
with the tool's result is rendered by the template as its `<tool_response>` turn."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SkippyServer

WEATHER: Any = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def qwen_server(start_up: Callable[..., Any], qwen05b_path: Path) -> Iterator[SkippyServer]:
    with start_up("up-qwen-tools", None, "--model", str(qwen05b_path), "--ctx-size", "2048") as s:
        yield s


@pytest.fixture(scope="module")
def qwen_client(qwen_server: SkippyServer) -> Iterator[openai.OpenAI]:
    c = qwen_server.client(timeout=120.0)
    yield c
    c.close()


@pytest.mark.gemma
def test_auto_tool_choice_call_comes_back_as_tool_calls(qwen_server: SkippyServer, qwen_client: openai.OpenAI) -> None:
    props = qwen_server.request("GET", "/props").json()
    assert props["chat_template_engine"] == "jinja" and props["chat_template_caps"]["supports_tools"] is True
    r = qwen_client.chat.completions.create(model=qwen_server.model_id, messages=ASK, tools=[WEATHER],
                                            tool_choice="auto", temperature=0, max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not (choice.message.content or "").strip()

    stream = qwen_client.chat.completions.create(model=qwen_server.model_id, messages=ASK, tools=[WEATHER],
                                                 tool_choice="auto", temperature=0, max_tokens=64, stream=True)
    name, arguments, finish, content = None, "", None, ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            name = name or (part.function.name if part.function else None)
            arguments += (part.function.arguments or "") if part.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, finish, content.strip()) == ("get_weather", "tool_calls", "")
    assert json.loads(arguments) == {"city": "Paris"}


@pytest.mark.gemma
def test_the_tool_result_goes_back_through_the_template(qwen_server: SkippyServer, qwen_client: openai.OpenAI) -> None:
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    prompt = qwen_server.request("POST", "/apply-template", {"messages": turns, "tools": [WEATHER]}).json()["prompt"]
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert prompt.endswith("<|im_start|>user\n<tool_response>\n18 C and sunny\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n")
    r = qwen_client.chat.completions.create(model=qwen_server.model_id, messages=turns, tools=[WEATHER],
                                            temperature=0, max_tokens=48)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage is not None and r.usage.prompt_tokens == qwen_server.request(
        "POST", "/v1/chat/completions/input_tokens", {"messages": turns, "tools": [WEATHER]}).json()["input_tokens"]
