"""The context through `skippy up`: the model's trained one by default, reported as llama-server and vLLM report
it, and a prompt over it refused by each API in its own words.

The server is the tiny llama written with a 32k trained context (2 real stages, broker, adapter), no `--ctx-size`
and `--kv-pool-cells 40000`: every request gets the 32k context, the lanes share 40000 cells. /v1/models (each
entry and /v1/models/{id}) carries vLLM's `max_model_len` and llama-server's `meta.n_ctx_train` / `meta.n_ctx`;
/props its `n_ctx`, `n_ctx_train` and `max_model_len`. A prompt longer than 512 tokens, the former default,
is served. A prompt over 32k tokens is a 400 `context_length_exceeded` with OpenAI's message on chat, completions
and the Responses API (through the official clients), and Anthropic's "prompt is too long: N tokens > M maximum"
(an `invalid_request_error`) on /v1/messages, which Claude Code answers by compacting.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from up_helpers import SkippyServer

TRAINED = 32768
POOL = 40000
TOO_LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 3700)  # 33300 words: > 32768 tokens


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_model: Callable[..., Path]) -> Iterator[SkippyServer]:
    model = tiny_model("llama", n_ctx_train=TRAINED)
    with start_up("up-context", model, "--kv-pool-cells", str(POOL), "--no-speculative") as s:
        yield s


def test_the_context_is_the_trained_one_and_the_pool_the_one_given(server: SkippyServer) -> None:
    for stage_id in ("stage0", "stage1"):
        config = json.loads((server.run_dir / "topology" / f"{stage_id}.json").read_text())
        assert (config["ctx_size"], config["kv_pool_cells"]) == (TRAINED, POOL)
        lines = [json.loads(line) for line in (server.run_dir / f"{stage_id}.log").read_text().splitlines()
                 if line.startswith("{") and '"context_sized"' in line]
        assert lines and (lines[0]["ctx_size"], lines[0]["kv_pool_cells"], lines[0]["n_ctx_train"]) == (TRAINED, POOL,
                                                                                                         TRAINED)


def test_models_report_the_context_as_llama_server_and_vllm_do(server: SkippyServer) -> None:
    listed = server.request("GET", "/v1/models").json()["data"]
    one = server.request("GET", f"/v1/models/{server.model_id}").json()
    for entry in (*listed, one):
        assert entry["id"] == server.model_id and entry["max_model_len"] == TRAINED
        assert entry["meta"]["n_ctx_train"] == entry["meta"]["n_ctx"] == TRAINED
    with server.client() as client:
        model = client.models.retrieve(server.model_id)
        assert model.model_extra is not None and model.model_extra["max_model_len"] == TRAINED


def test_props_report_the_context(server: SkippyServer) -> None:
    props = server.request("GET", "/props").json()
    assert (props["n_ctx"], props["max_model_len"], props["n_ctx_train"]) == (TRAINED, TRAINED, TRAINED)
    assert props["default_generation_settings"]["n_ctx"] == TRAINED


def test_a_prompt_past_the_former_512_default_is_served(server: SkippyServer) -> None:
    words = " ".join(["the quick brown fox jumps over the lazy dog"] * 300)  # ~2700 tokens
    with server.client() as client:
        reply = client.chat.completions.create(model=server.model_id, max_tokens=4,
                                               messages=[{"role": "user", "content": words}])
    assert reply.usage is not None and reply.usage.prompt_tokens > 2048 and reply.usage.completion_tokens == 4


@pytest.mark.parametrize("route", ["chat", "completions", "responses"])
def test_openai_routes_refuse_a_prompt_over_the_context(server: SkippyServer, route: str) -> None:
    with server.client() as client, pytest.raises(openai.BadRequestError) as info:
        if route == "chat":
            client.chat.completions.create(model=server.model_id, max_tokens=4,
                                           messages=[{"role": "user", "content": TOO_LONG}])
        elif route == "completions":
            client.completions.create(model=server.model_id, prompt=TOO_LONG, max_tokens=4)
        else:
            client.responses.create(model=server.model_id, input=TOO_LONG, max_output_tokens=16)
    error = info.value
    assert (error.status_code, error.code, error.type) == (400, "context_length_exceeded", "invalid_request_error")
    assert isinstance(error.body, dict)
    message = error.body["message"]
    assert message.startswith(f"This model's maximum context length is {TRAINED} tokens. However, your ")
    assert int(message.split(" resulted in ")[1].split(" ")[0]) > TRAINED


def test_anthropic_messages_refuse_a_prompt_over_the_context_in_anthropics_words(server: SkippyServer) -> None:
    raw = server.request("POST", "/v1/messages", {"model": server.model_id, "max_tokens": 16,
                                                  "messages": [{"role": "user", "content": TOO_LONG}]})
    body = raw.json()
    assert raw.status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    head, _, tail = body["error"]["message"].partition(" tokens > ")
    assert head.startswith("prompt is too long: ") and int(head.removeprefix("prompt is too long: ")) > TRAINED
    assert tail == f"{TRAINED - 1} maximum"
    claude = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=60.0)
    try:
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long: "):
            claude.messages.create(model=server.model_id, max_tokens=16, messages=[{"role": "user", "content": TOO_LONG}])
    finally:
        claude.close()
