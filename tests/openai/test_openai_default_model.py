"""`skippy up` with its defaults (the packaged Qwen2.5-Coder-0.5B-Instruct, whole in one stage as the plan for one
host says) serves the README's examples as printed, through the official client: the chat example answers with
code; the tool call example comes back as the call (its own chat template given the tools, the call read from its
`<tool_call>` or untagged JSON); the fill-in-the-middle examples (/infill and a completion's `suffix`) fill the
gap; a request that sets no sampling fields gets the model card's sampling (temperature 0.7, top_p 0.8, top_k 20,
repeat penalty 1.05), shown by /props."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SkippyServer

MODEL_ID = "qwen2.5-coder-0.5b-instruct-q4_k_m"
# the README's examples, as printed there
README_CHAT: Any = [{"role": "user", "content": "In Python, how do I reverse a string s? One line of code, no explanation."}]
README_INFILL = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 16,
                 "temperature": 0}
README_WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
README_TOOL_CHAT: Any = [{"role": "user", "content": "What is the weather in Paris right now?"}]
README_SUFFIX = {"model": MODEL_ID, "prompt": "def fibonacci(n):\n    ", "suffix": "\n\nprint(fibonacci(10))\n",
                 "max_tokens": 64, "temperature": 0}


@pytest.fixture(scope="module")
def default_server(start_up: Callable[..., Any], qwen05b_path: Path) -> Iterator[SkippyServer]:
    assert qwen05b_path.is_file()
    with start_up("up-default", None) as s:
        yield s


@pytest.fixture(scope="module")
def default_client(default_server: SkippyServer) -> Iterator[openai.OpenAI]:
    c = default_server.client()
    yield c
    c.close()


@pytest.mark.gemma
def test_default_is_qwen_coder_in_one_stage_with_its_own_template(default_server: SkippyServer) -> None:
    assert default_server.model_id == MODEL_ID
    props = default_server.request("GET", "/props").json()
    assert props["stages"] == [{"stage_id": "stage0", "layer_start": 0, "layer_end": 24}]  # one host: not split
    assert "<|im_start|>" in props["chat_template"] and "tools" in props["chat_template"]


@pytest.mark.gemma
def test_the_readme_chat_example_answers_with_the_code(default_server: SkippyServer,
                                                      default_client: openai.OpenAI) -> None:
    """Sent as printed (no sampling fields), with a seed each so a failure is reproducible."""
    answers = [default_client.chat.completions.create(model=MODEL_ID, messages=README_CHAT, max_tokens=64, seed=seed)
               for seed in range(4)]
    texts = [a.choices[0].message.content or "" for a in answers]
    assert all("[::-1]" in t for t in texts), texts


@pytest.mark.gemma
def test_props_show_the_model_cards_sampling_and_a_requests_fields_win(default_server: SkippyServer,
                                                                      default_client: openai.OpenAI) -> None:
    settings = default_server.request("GET", "/props").json()["default_generation_settings"]
    params = settings["params"]
    assert (params["temperature"], params["top_k"], params["top_p"], params["repeat_penalty"]) == (0.7, 20, 0.8, 1.05)
    assert {k: settings["sampling_source"][k] for k in ("temperature", "top_p", "top_k", "repeat_penalty")} == dict.fromkeys(
        ("temperature", "top_p", "top_k", "repeat_penalty"), "model card")
    greedy = [default_client.chat.completions.create(model=MODEL_ID, messages=README_CHAT, max_tokens=24, temperature=0,
                                                     seed=seed).choices[0].message.content for seed in (1, 2)]
    assert greedy[0] == greedy[1]  # its own temperature 0 wins over the default 0.7: greedy, whatever the seed


@pytest.mark.gemma
def test_the_readme_fill_in_the_middle_examples_fill_the_gap(default_server: SkippyServer) -> None:
    infill = default_server.request("POST", "/infill", README_INFILL)
    assert infill.status == 200, infill.body
    assert infill.json()["content"].startswith("return a + b"), infill.json()
    completion = default_server.request("POST", "/v1/completions", README_SUFFIX)
    assert completion.status == 200, completion.body
    text = completion.json()["choices"][0]["text"]
    assert "fibonacci(n - 1)" in text.replace("n-1", "n - 1") and "print(fibonacci(10))" not in text.split("\n")[0], text


@pytest.mark.gemma
def test_the_readme_tool_call_example_calls_the_tool(default_client: openai.OpenAI) -> None:
    """Sent as printed (tool_choice auto, the model's sampling), a seed each."""
    for seed in range(4):
        reply = default_client.chat.completions.create(model=MODEL_ID, tools=[README_WEATHER], messages=README_TOOL_CHAT,
                                                       seed=seed)
        call = (reply.choices[0].message.tool_calls or [None])[0]
        assert call is not None, (seed, reply.choices[0].message.content)
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"}), seed
        assert reply.choices[0].finish_reason == "tool_calls"
