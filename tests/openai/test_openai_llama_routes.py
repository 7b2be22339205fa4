"""llama-server's smaller routes and stream extras through `skippy up` on real stages (a tiny llama whose
GGUF declares fill-in-the-middle tokens, split at layer 3): /props, /slots, /apply-template,
/v1/chat/completions/input_tokens, /tokenize's `model` and vLLM forms, /infill and completions with
`suffix`, SSE pings while a request waits (`--openai-sse-ping-interval`) and `return_progress` chunks.
The model without FIM tokens (the default SmolLM2) is tests/openai/test_openai_default_model.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SkippyServer, wait_idle

from skippy.runtime.tokenizer import Tokenizer
from skippy.testing.tiny_models import FIM_TOKENS

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world, the quick brown fox"}]
PING_INTERVAL_S = "0.02"
CHUNK = 16  # prefill chunk size: a long prompt reports its progress chunk by chunk


@pytest.fixture(scope="module")
def fim_llama(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("llama", fim=True)


@pytest.fixture(scope="module")
def routes_server(start_up: Callable[..., Any], fim_llama: Path) -> Iterator[SkippyServer]:
    """One generation at a time (so a second request waits), pings after 20 ms of silence, fixed 16-token chunks,
    no prefix cache (every prompt prefills from 0)."""
    with start_up("up-llama-routes", fim_llama, "--openai-generation-concurrency", "1",
                  "--openai-sse-ping-interval", PING_INTERVAL_S, "--openai-prefill-chunk-policy", "fixed",
                  "--openai-prefill-chunk-size", str(CHUNK), "--no-prefix-cache") as s:
        yield s


@pytest.fixture(scope="module")
def routes_client(routes_server: SkippyServer) -> Iterator[openai.OpenAI]:
    c = routes_server.client()
    yield c
    c.close()


def sse_events(body: bytes) -> tuple[list[Any], int]:
    """(the data events, JSON-decoded but [DONE] kept as the string, number of `: ping` comments) of a stream."""
    events, pings = [], 0
    for block in body.decode().split("\n\n"):
        if block.startswith(": ping"):
            pings += 1
        elif block.startswith("data: "):
            data = block.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events, pings


def test_props_show_the_served_model_its_lanes_sampling_and_stages(routes_server: SkippyServer) -> None:
    props = routes_server.request("GET", "/props").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 2048 and props["total_slots"] == 1  # the generations run at once (concurrency 1)
    assert settings["params"] == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
                                  "max_tokens": 4096}  # the tiny GGUF states none: llama.cpp's defaults
    assert set(settings["sampling_source"].values()) == {"llama.cpp"}
    assert props["model_alias"] == routes_server.model_id and props["infill"] is True
    assert props["chat_template_source"] == "builtin" and props["chat_template"]
    assert props["stages"] == [{"stage_id": "stage0", "layer_start": 0, "layer_end": 3},
                               {"stage_id": "stage1", "layer_start": 3, "layer_end": 6}]


def test_slots_has_one_entry_per_generation_lane_with_each_stages_layer_range(routes_server: SkippyServer) -> None:
    wait_idle(routes_server)
    slots = routes_server.request("GET", "/slots").json()
    assert [s["id"] for s in slots] == [0]
    assert all(s["n_ctx"] == 2048 and s["is_processing"] is False for s in slots)  # the GGUF's trained context
    assert all([(st["layer_start"], st["layer_end"]) for st in s["stages"]] == [(0, 3), (3, 6)] for s in slots)


def test_apply_template_and_input_tokens_agree_with_the_chat_usage(routes_server: SkippyServer,
                                                                  routes_client: openai.OpenAI) -> None:
    prompt = routes_server.request("POST", "/apply-template", {"messages": CHAT}).json()["prompt"]
    assert "hello world, the quick brown fox" in prompt and "be brief" in prompt
    counted = routes_server.request("POST", "/v1/chat/completions/input_tokens",
                                    {"model": routes_server.model_id, "messages": CHAT}).json()
    reply = routes_client.chat.completions.create(model=routes_server.model_id, messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
    assert counted == {"input_tokens": reply.usage.prompt_tokens}  # type: ignore[union-attr]
    bad = routes_server.request("POST", "/apply-template", {"messages": "hello"})
    assert bad.status == 400 and "messages" in bad.json()["error"]["message"]


def test_tokenize_takes_model_and_vllms_prompt_and_messages_forms(routes_server: SkippyServer, fim_llama: Path) -> None:
    model = routes_server.model_id
    tokenizer = Tokenizer(fim_llama)
    try:
        expected = tokenizer.encode("the quick brown fox", add_special=True, parse_special=True)
    finally:
        tokenizer.close()
    llama_form = routes_server.request("POST", "/tokenize", {"model": model, "content": "the quick brown fox",
                                                             "add_special": True}).json()
    assert llama_form == {"tokens": expected}
    vllm = routes_server.request("POST", "/tokenize", {"model": model, "prompt": "the quick brown fox"}).json()
    assert vllm == {"count": len(expected), "max_model_len": 2048, "tokens": expected, "token_strs": None}
    chat = routes_server.request("POST", "/tokenize", {"model": model, "messages": CHAT, "return_token_strs": True}).json()
    counted = routes_server.request("POST", "/v1/chat/completions/input_tokens", {"messages": CHAT}).json()
    assert chat["count"] == len(chat["tokens"]) == len(chat["token_strs"]) == counted["input_tokens"]
    other = routes_server.request("POST", "/tokenize", {"model": "other", "content": "x"})
    assert other.status == 404 and other.json()["error"]["code"] == "model_not_found"
    unknown = routes_server.request("POST", "/tokenize", {"prompt": "x", "bogus": 1})  # ignored
    assert unknown.status == 200 and unknown.json()["count"] == len(unknown.json()["tokens"])


def test_infill_and_completion_suffix_fill_the_middle(routes_server: SkippyServer, routes_client: openai.OpenAI,
                                                      fim_llama: Path) -> None:
    body = {"input_prefix": "the quick", "input_suffix": "the lazy dog", "n_predict": 6, "temperature": 0,
            "ignore_eos": True}
    native = routes_server.request("POST", "/infill", body).json()
    assert native["stop"] is True and native["tokens_predicted"] == 6 and isinstance(native["content"], str)
    tokenizer = Tokenizer(fim_llama)
    try:
        ids = {name: tokenizer.encode(text, add_special=False, parse_special=True)[0] for name, text in FIM_TOKENS.items()}
        prefix = tokenizer.encode("the quick", add_special=False)
        suffix = tokenizer.encode("the lazy dog", add_special=False)
    finally:
        tokenizer.close()
    # BOS, [PRE] prefix [SUF] suffix [MID]: llama-server's prompt
    assert native["tokens_evaluated"] == 1 + 1 + len(prefix) + 1 + len(suffix) + 1, (ids, native)
    openai_form = routes_client.completions.create(model=routes_server.model_id, prompt="the quick", suffix="the lazy dog",
                                                   max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert openai_form.choices[0].text == native["content"]  # the same prompt, greedy: the same middle
    streamed = routes_server.request("POST", "/infill", {**body, "stream": True})
    events, _ = sse_events(streamed.body)
    assert "[DONE]" not in events and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == native["content"]
    missing = routes_server.request("POST", "/infill", {"input_suffix": "x"})
    assert missing.status == 400 and missing.json()["error"]["param"] == "input_prefix"


WAITING_STREAMS = {  # each API's streamed request, and what its stream ends with
    "chat": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "stream": True}, (b"data: [DONE]",)),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "stream": True},
                  (b"event: response.completed", b"event: response.incomplete")),  # 4 tokens may cut it short
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
                 (b"event: message_stop",)),
}


@pytest.mark.parametrize("api", list(WAITING_STREAMS))
def test_a_waiting_stream_is_pinged_and_then_served(routes_server: SkippyServer, routes_client: openai.OpenAI,
                                                    api: str) -> None:
    """With one generation permit a second stream waits for it; it starts anyway, pinging while silent (chat
    completions, Responses and Messages streams alike)."""
    path, body, last = WAITING_STREAMS[api]
    wait_idle(routes_server)
    first = threading.Thread(target=lambda: routes_client.completions.create(
        model=routes_server.model_id, prompt="once upon a time", max_tokens=200, extra_body={"ignore_eos": True}))
    first.start()
    try:
        deadline = time.monotonic() + 30
        while routes_server.request("GET", "/readyz").json().get("running") != 1:  # bounded poll: the first runs
            assert time.monotonic() < deadline, "the first request never ran"
            time.sleep(0.005)
        waiting = routes_server.request("POST", path, {"model": routes_server.model_id, **body})
    finally:
        first.join(60)
    _, pings = sse_events(waiting.body)
    assert waiting.status == 200 and pings >= 1, waiting.body[:300]
    assert waiting.body.rstrip().rsplit(b"\n\n", 1)[-1].startswith(last), waiting.body[-300:]
    if api == "chat":
        events, _ = sse_events(waiting.body)
        assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_return_progress_reports_each_prefill_chunk_before_the_first_token(routes_server: SkippyServer) -> None:
    wait_idle(routes_server)
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)
    reply = routes_server.request("POST", "/v1/chat/completions", {
        "model": routes_server.model_id, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 3,
        "stream": True, "return_progress": True, "stream_options": {"include_usage": True}})
    events, _ = sse_events(reply.body)
    progress = [e["prompt_progress"] for e in events if isinstance(e, dict) and "prompt_progress" in e]
    total = events[-2]["usage"]["prompt_tokens"]
    assert len(progress) == -(-total // CHUNK), progress  # one report per chunk
    assert [p["processed"] for p in progress] == [min(total, CHUNK * (i + 1)) for i in range(len(progress))]
    assert all(p["total"] == total and p["cache"] == 0 and p["time_ms"] >= 0 for p in progress)
    for p in progress:  # each stage's prefill rate on the batches that carried this prompt, in pipeline order
        assert list(p["stages"]) == ["stage0", "stage1"], p
        assert all(rate["tokens_per_s"] > 0 for rate in p["stages"].values()), p
    first_text = next(i for i, e in enumerate(events) if isinstance(e, dict) and e.get("choices")
                      and e["choices"][0]["delta"].get("content"))
    last_progress = max(i for i, e in enumerate(events) if isinstance(e, dict) and "prompt_progress" in e)
    assert last_progress < first_text
    plain = routes_server.request("POST", "/v1/chat/completions", {
        "model": routes_server.model_id, "messages": CHAT, "max_tokens": 3, "stream": True})
    assert b"prompt_progress" not in plain.body  # only on request
