"""Structured output, tool calls, tokenize, CORS and refused fields against `skippy up` on the tiny llama.

The tiny model's weights are random, so only the grammar makes its output JSON: a bounded schema (enums,
short strings, few items) must end with `stop` and validate; free JSON usually runs into max_tokens.

Seeded sampling is compared token for token (streamed vs whole, speculative vs plain), so these servers run
without the prefix cache: its entries keep KV cells, which moves where a later request's cells sit in
llama.cpp's unified KV cache, and llama.cpp's CPU attention (tiled / KV-chunked flash attention) rounds
differently there, so the logits differ slightly (up to ~1e-2 on this model) and a seeded draw
near a boundary flips. Alone on a server without entries a request's cells always start at cell 0. The
module's own server decodes plainly: the default speculation policy's verify windows follow served prices, so
two runs of one request may take batches of different shapes (README, "What is exact").
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import structured_checks as checks
from prometheus_client.parser import text_string_to_metric_families
from up_helpers import SkippyServer

from skippy.runtime.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    """This module's server (conftest's `client` talks to it): room for the tools prompt, no prefix cache and
    plain decoding (seeded outputs are compared exactly: see the module docstring)."""
    with start_up("up-structured", tiny_llama, "--ctx-size", "2048", "--no-prefix-cache", "--no-speculative") as s:
        yield s


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 5},
                                      {"temperature": 0.9, "top_k": 20, "seed": 6, "frequency_penalty": 1.0}])
def test_json_schema_with_enum_nested_object_and_array_validates(
        server: SkippyServer, client: openai.OpenAI, sampling: dict[str, Any]) -> None:
    extra = {k: sampling.pop(k) for k in ("top_k",) if k in sampling}
    finish, content = checks.structured(client, server.model_id, "A pet, please.", checks.PET, max_tokens=400,
                                        extra_body=extra, **sampling)
    assert finish == "stop"  # the schema bounds the output's length
    ask = [{"role": "user", "content": "A pet, please."}]
    streamed, stream_finish = checks.streamed_text(client, server.model_id, messages=ask, max_tokens=400,
                                                   response_format=checks.schema_format(checks.PET),
                                                   extra_body=extra, **sampling)
    assert (streamed, stream_finish) == (content, "stop")


def test_json_object_ends_with_stop_only_when_it_parses(server: SkippyServer, client: openai.OpenAI,
                                                       tiny_llama: Path) -> None:
    tokenizer = Tokenizer(tiny_llama)
    try:
        close = [t for t in range(tokenizer.n_vocab) if tokenizer.piece(t) == b"}"]
        eos = sorted(tokenizer.eog_tokens())
    finally:
        tokenizer.close()
    bias = {str(t): 100 for t in close + eos}  # the grammar still decides: `{` must come first
    r = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "{}"}], max_tokens=20,
                                       response_format={"type": "json_object"}, logit_bias=bias, temperature=0)
    assert r.choices[0].finish_reason == "stop" and json.loads(r.choices[0].message.content or "") == {}
    free = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "json"}],
                                          max_tokens=6, response_format={"type": "json_object"}, temperature=0)
    assert free.choices[0].finish_reason == "length" and (free.choices[0].message.content or "").startswith("{")


def test_max_tokens_cuts_structured_output_with_length(server: SkippyServer, client: openai.OpenAI) -> None:
    finish, content = checks.structured(client, server.model_id, "A pet.", checks.PET, max_tokens=5, temperature=0)
    assert finish == "length" and content.startswith("{")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_tool_call(server: SkippyServer, client: openai.OpenAI, stream: bool, choice: Any) -> None:
    name, arguments = checks.tool_call(client, server.model_id, "What time is it in Oslo?", choice, stream,
                                       max_tokens=300, temperature=0)
    if isinstance(choice, dict):
        assert name == "get_time"
    again = checks.tool_call(client, server.model_id, "What time is it in Oslo?", choice, not stream,
                             max_tokens=300, temperature=0)
    assert again == (name, arguments)  # streamed and whole give the same call


@pytest.mark.parametrize("seed", range(4))
def test_auto_tool_choice_gives_text_or_a_valid_call(server: SkippyServer, client: openai.OpenAI, seed: int) -> None:
    r = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                       tools=checks.TOOLS, max_tokens=200, temperature=1.0, seed=seed)
    choice = r.choices[0]
    if choice.message.tool_calls:
        (call,) = choice.message.tool_calls
        assert choice.finish_reason in ("tool_calls", "length") and not choice.message.content
        if choice.finish_reason == "tool_calls":
            assert checks.schema_error(json.loads(call.function.arguments), checks.PARAMS[call.function.name]) is None
    else:
        assert choice.finish_reason in ("stop", "length") and not (choice.message.content or "").lstrip().startswith("<")


def test_tool_results_go_back_to_the_model(server: SkippyServer, client: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees, rain"}]
    r = client.chat.completions.create(model=server.model_id, messages=messages, tools=checks.TOOLS, tool_choice="none",
                                       max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None


def test_tokenize_round_trip_models_and_cors(server: SkippyServer, client: openai.OpenAI) -> None:
    checks.tokenize_round_trip(server, "Hello world, héllo!")
    (model,) = client.models.list().data
    assert model.id == server.model_id and model.created > 0 and model.owned_by == "skippy"
    checks.cors_preflight(server)


def test_unhonoured_fields_are_refused_by_name(server: SkippyServer, client: openai.OpenAI) -> None:
    checks.refusals(client, server.model_id)


def test_completion_prompt_as_token_ids(server: SkippyServer, client: openai.OpenAI) -> None:
    ids = checks.tokenize_round_trip(server, "Once upon a time")
    by_ids = client.completions.create(model=server.model_id, prompt=ids, max_tokens=4, temperature=0)
    by_text = client.completions.create(model=server.model_id, prompt="Once upon a time", max_tokens=4, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids) and by_text.usage.prompt_tokens == len(ids) + 1  # + BOS
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model_id, prompt=[10**9], max_tokens=4)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "prompt"


def test_speculative_verify_windows_keep_the_grammar_exact(server: SkippyServer, client: openai.OpenAI,
                                                          start_up: Callable[..., Any], tiny_llama: Path,
                                                          tmp_path: Path) -> None:
    """With an n-gram proposer the final stage samples verify windows row by row under the grammar: the
    output (greedy and seeded) equals plain decoding's, so the grammar saw exactly the committed tokens."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"requested_strategy": "ngram", "effective_strategy": "ngram-suffix",
                                "ngram": {"kind": "suffix", "min_ngram": 3, "max_ngram": 8, "max_proposal_tokens": 8},
                                "verify_window": {"min_tokens": 1, "max_tokens": 8}}))
    schema = {"type": "array", "minItems": 12, "maxItems": 12, "items": {"enum": ["aa", "bb"]}}  # repetitive
    ask: dict[str, Any] = {"messages": [{"role": "user", "content": json.dumps(["aa"] * 12)}],
                           "response_format": checks.schema_format(schema), "max_tokens": 200}
    samplings: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 1.0, "seed": 11}]
    plain = [client.chat.completions.create(model=server.model_id, **ask, **s) for s in samplings]
    with start_up("up-structured-spec", tiny_llama, "--ctx-size", "2048", "--no-prefix-cache",
                  "--openai-speculative-config", str(plan), "--openai-speculative-window", "8") as spec_server:
        spec_client = spec_server.client()
        spec = [spec_client.chat.completions.create(model=spec_server.model_id, **ask, **s) for s in samplings]
        spec_client.close()
        metrics = spec_server.request("GET", "/metrics").body.decode()
    for p, s in zip(plain, spec):
        assert s.choices[0].finish_reason == p.choices[0].finish_reason == "stop"
        assert s.choices[0].message.content == p.choices[0].message.content
        assert checks.schema_error(json.loads(s.choices[0].message.content or ""), schema) is None
    timings = [(s.model_extra or {}).get("timings", {}) for s in spec]
    assert sum(t.get("draft_n_accepted", 0) for t in timings) > 0  # drafted rows were accepted ...
    assert sum(t["speculative"]["wasted_rows"] for t in timings) > 0  # ... and rejected, never reaching the grammar
    # llama-server's spec_decode_* counters (prefix skippy_), acceptance per draft position included
    samples = {(m.name, m.labels.get("position")): m.value for family in text_string_to_metric_families(metrics)
               for m in family.samples}
    per_pos = [sum(n) for n in itertools.zip_longest(*(t["speculative"]["accepted_per_pos"] for t in timings),
                                                     fillvalue=0)]
    assert per_pos[0] > 0 and sum(per_pos) == sum(t["draft_n_accepted"] for t in timings)
    assert samples[("skippy_spec_decode_num_accepted_tokens_total", None)] == sum(per_pos)
    assert samples[("skippy_spec_decode_num_draft_tokens_total", None)] == sum(t["draft_n"] for t in timings)
    assert samples[("skippy_spec_decode_num_drafts_total", None)] == sum(t["speculative"]["windows"] for t in timings)
    assert [samples[("skippy_spec_decode_num_accepted_tokens_per_pos_total", str(i))] for i in range(len(per_pos))
            ] == per_pos
