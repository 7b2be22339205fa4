"""`skippy up --model smollm2-135m` (the packaged SmolLM2-135M-Instruct, the suite's fast instruct model, whole in one
stage as the plan for one host says, its ChatML template from the GGUF) serves the official client: "Name three
colors." names colours; a request that
sets no sampling fields gets its model card's temperature and top_p (the GGUF states none) and llama.cpp's
top_k and min_p, shown by /props; the model has no
fill-in-the-middle tokens, so /infill and a completion `suffix` are 400s saying so."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SkippyServer

COLOURS = frozenset({"red", "blue", "green", "yellow", "orange", "purple", "pink", "black", "white", "brown", "gray",
                     "grey", "violet", "indigo", "cyan", "magenta"})
README_CHAT: Any = [{"role": "user", "content": "Name three colors."}]  # the README's example before Qwen
# with no system turn its own template gives it its default one ("You are a helpful AI assistant named SmolLM..."),
# after which it names colours in about half the sampled answers (4 of 8 seeds); asked to answer briefly, in 8 of 8
BRIEF_CHAT: Any = [{"role": "system", "content": "Answer briefly."}, *README_CHAT]


def colours_in(text: str) -> set[str]:
    return {word for word in re.findall(r"[a-z]+", text.lower()) if word in COLOURS}


@pytest.fixture(scope="module")
def smollm2_server(start_up: Callable[..., Any], smollm2_path: Path) -> Iterator[SkippyServer]:
    assert smollm2_path.is_file()
    with start_up("up-smollm2", None, "--model", "smollm2-135m") as s:
        yield s


@pytest.fixture(scope="module")
def smollm2_client(smollm2_server: SkippyServer) -> Iterator[openai.OpenAI]:
    c = smollm2_server.client()
    yield c
    c.close()


def ask(client: openai.OpenAI, server: SkippyServer, **kwargs: Any) -> str:
    reply = client.chat.completions.create(model=server.model_id, max_tokens=32, messages=BRIEF_CHAT, **kwargs)
    return reply.choices[0].message.content or ""


@pytest.mark.gemma
def test_smollm2_in_one_stage_with_its_own_template(smollm2_server: SkippyServer,
                                                    smollm2_client: openai.OpenAI) -> None:
    assert smollm2_server.model_id == "smollm2-135m-instruct-q4_1"
    props = smollm2_server.request("GET", "/props").json()
    assert props["stages"] == [{"stage_id": "stage0", "layer_start": 0, "layer_end": 30}]  # one host: not split
    assert props["chat_template_source"] == "gguf" and "<|im_start|>" in props["chat_template"]
    assert props["eos_token"] == "<|im_end|>"
    r = smollm2_client.chat.completions.create(model=smollm2_server.model_id, max_tokens=32, temperature=0,
                                               messages=README_CHAT)
    content = r.choices[0].message.content or ""
    assert len(colours_in(content)) == 3, content
    assert r.choices[0].finish_reason == "stop"  # it ends its answer (<|im_end|>) well within 32 tokens
    assert r.usage is not None and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@pytest.mark.gemma
def test_sampled_with_the_default_sampling_it_names_colours_nearly_every_time(smollm2_server: SkippyServer,
                                                                           smollm2_client: openai.OpenAI) -> None:
    """No sampling fields (a seed each, so a failure is reproducible)."""
    answers = [ask(smollm2_client, smollm2_server, seed=seed) for seed in range(8)]
    named = [len(colours_in(a)) >= 2 for a in answers]
    assert sum(named) >= 7, list(zip(named, answers))


@pytest.mark.gemma
def test_props_show_the_sampling_defaults_and_a_requests_fields_win(smollm2_server: SkippyServer,
                                                                   smollm2_client: openai.OpenAI) -> None:
    settings = smollm2_server.request("GET", "/props").json()["default_generation_settings"]
    params = settings["params"]
    assert (params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == (0.2, 40, 0.9, 0.05)
    assert settings["sampling_source"] == {"temperature": "model card", "top_p": "model card", "top_k": "llama.cpp",
                                           "min_p": "llama.cpp", "repeat_penalty": "llama.cpp"}
    greedy = [ask(smollm2_client, smollm2_server, temperature=0, seed=seed) for seed in (1, 2)]
    assert greedy[0] == greedy[1]  # its own temperature 0 wins over the default 0.2: greedy, whatever the seed


@pytest.mark.gemma
def test_fill_in_the_middle_is_refused_naming_the_missing_tokens(smollm2_server: SkippyServer) -> None:
    infill = smollm2_server.request("POST", "/infill", {"input_prefix": "def f(", "input_suffix": "):"})
    assert infill.status == 400 and infill.json()["error"]["code"] == "infill_unsupported"
    assert "no fill-in-the-middle tokens" in infill.json()["error"]["message"]
    suffix = smollm2_server.request("POST", "/v1/completions", {"model": smollm2_server.model_id, "prompt": "def f(",
                                                                "suffix": "):"})
    assert suffix.status == 400 and suffix.json()["error"]["param"] == "suffix"
