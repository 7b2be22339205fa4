"""Generation through `skippy up` with the official OpenAI client: chat and completions, streamed and
not, usage, stop strings, seeded sampling and logprobs (tiny random llama: gibberish, but greedy
decoding is deterministic, so streamed text must equal non-streamed text).

These tests compare two greedy (or two seeded) runs of one request bitwise, which plain decoding promises and
the default speculation policy does not (its verify windows follow served prices, so two runs can take batches
of different shapes, and llama.cpp rounds by batch shape: README, "What is exact"). Their server is the
shared one's flags with `--no-speculative`; tests/openai/test_openai_deterministic.py covers the exact mode
with speculation on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SHARED_SERVER_FLAGS, SkippyServer, wait_idle

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "hello world, the quick brown fox"}]
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    """The shared server's flags, decoding plainly (module docstring)."""
    with start_up("up-generation", tiny_llama, *SHARED_SERVER_FLAGS, "--no-speculative") as s:
        yield s


def create(client: openai.OpenAI, server: SkippyServer, kind: str, **kwargs: Any) -> Any:
    if kind == "chat":
        return client.chat.completions.create(model=server.model_id, messages=kwargs.pop("messages", CHAT), **kwargs)
    return client.completions.create(model=server.model_id, prompt=kwargs.pop("prompt", PROMPT), **kwargs)


def text_of(response: Any, kind: str) -> str:
    choice = response.choices[0]
    return choice.message.content if kind == "chat" else choice.text


def collect_stream(stream: Any, kind: str) -> tuple[list[str], str | None, Any, list[Any]]:
    """(text deltas, finish_reason, usage, all chunks) of a stream."""
    deltas: list[str] = []
    finish, usage, chunks = None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            assert chunk.choices == [], "the usage chunk carries no choices"
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        piece = choice.delta.content if kind == "chat" else choice.text
        if piece:
            deltas.append(piece)
        if choice.finish_reason is not None:
            assert finish is None, "finish_reason sent twice"
            finish = choice.finish_reason
    return deltas, finish, usage, chunks


def assert_usage(usage: Any, completion_tokens: int | None = None) -> None:
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens >= 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if completion_tokens is not None:
        assert usage.completion_tokens == completion_tokens


# -- 1. chat and completions, non-stream and stream --------------------------------------------------
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_reassembles_to_non_stream_text(server: SkippyServer, client: openai.OpenAI, kind: str) -> None:
    max_tokens = 12
    full = create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS)
    text = text_of(full, kind)
    assert isinstance(text, str) and text
    assert full.choices[0].finish_reason == "length"
    assert full.object == ("chat.completion" if kind == "chat" else "text_completion")
    assert full.model == server.model_id
    assert_usage(full.usage, max_tokens)

    stream = create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS, stream=True,
                    stream_options={"include_usage": True})
    deltas, finish, usage, chunks = collect_stream(stream, kind)
    assert "".join(deltas) == text
    assert finish == "length"
    assert usage is not None, "stream_options.include_usage must give a final usage chunk"
    assert chunks[-1].usage is not None, "the usage chunk comes last"
    # the same prompt again restores all but its last token from the prefix cache (when it is long enough
    # to be recorded, min_tokens): only that may differ
    cached = [u.prompt_tokens_details.cached_tokens for u in (full.usage, usage)]
    assert cached[1] in (0, full.usage.prompt_tokens - 1), cached
    for u in (full.usage, usage):
        u.prompt_tokens_details.cached_tokens = 0
    assert usage.model_dump() == full.usage.model_dump()
    assert len({c.id for c in chunks}) == 1
    if kind == "chat":
        first = chunks[0].choices[0]
        assert first.delta.role == "assistant" and not first.delta.content and first.finish_reason is None
        assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
        assert all(c.object == "chat.completion.chunk" for c in chunks)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_without_include_usage_has_no_usage_chunk(server: SkippyServer, client: openai.OpenAI,
                                                         kind: str) -> None:
    stream = create(client, server, kind, max_tokens=5, temperature=0, extra_body=IGNORE_EOS, stream=True)
    deltas, finish, usage, chunks = collect_stream(stream, kind)
    assert finish == "length" and usage is None and deltas
    assert all(c.choices for c in chunks)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_natural_finish_is_consistent(server: SkippyServer, client: openai.OpenAI, kind: str) -> None:
    """Without ignore_eos: either the EOS stops it early ("stop") or max_tokens does ("length")."""
    max_tokens = 40
    full = create(client, server, kind, max_tokens=max_tokens, temperature=0)
    finish = full.choices[0].finish_reason
    assert finish in ("stop", "length")
    assert_usage(full.usage)
    if finish == "length":
        assert full.usage.completion_tokens == max_tokens
    else:
        assert full.usage.completion_tokens < max_tokens


def test_default_max_tokens_applies(server: SkippyServer, client: openai.OpenAI) -> None:
    full = client.completions.create(model=server.model_id, prompt=PROMPT, temperature=0, extra_body=IGNORE_EOS)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 11  # the shared server's --openai-default-max-tokens, not the default 4096


def test_models_lists_the_served_model(server: SkippyServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [server.model_id]


# -- 2. stop strings --------------------------------------------------------------------------------
def _stop_candidates(text: str, count: int = 3) -> list[tuple[int, str]]:
    """(position, stop) pairs: substrings first occurring at a position > 0, without U+FFFD."""
    found: list[tuple[int, str]] = []
    for length in (3, 2, 4):
        for start in (len(text) // 4, len(text) // 2, (3 * len(text)) // 4, 1):
            for p in range(max(1, start), len(text) - length):
                stop = text[p:p + length]
                if "\ufffd" not in stop and stop.strip() and text.find(stop) == p:
                    if all(p != q for q, _ in found):
                        found.append((p, stop))
                    break
            if len(found) >= count:
                return found
    return found


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stop_string_cuts_text_exactly(server: SkippyServer, client: openai.OpenAI, kind: str) -> None:
    max_tokens = 40
    reference = text_of(create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS),
                        kind)
    candidates = _stop_candidates(reference)
    assert candidates, f"no usable stop string in {reference!r}"
    for p, stop in candidates:
        expected = reference[:p]
        full = create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS, stop=stop)
        assert text_of(full, kind) == expected, f"stop={stop!r}"
        assert full.choices[0].finish_reason == "stop"
        assert 0 < full.usage.completion_tokens <= max_tokens
        assert_usage(full.usage)
        wait_idle(server)  # the stop cancelled the generation; let it leave the pipeline first

        stream = create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS,
                        stop=["\x00never", stop], stream=True, stream_options={"include_usage": True})
        deltas, finish, usage, _ = collect_stream(stream, kind)
        # No delta ever carried text past the cut (a held-back prefix of the stop string is never sent).
        assert "".join(deltas) == expected, f"stop={stop!r} deltas={deltas!r}"
        assert finish == "stop"
        assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
        wait_idle(server)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_partial_stop_match_is_released(server: SkippyServer, client: openai.OpenAI, kind: str) -> None:
    """A stop string whose prefix occurs but never completes: the held-back text is sent after all."""
    max_tokens = 20
    reference = text_of(create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS),
                        kind)
    stops = [reference[-2:] + "\x00", reference[len(reference) // 2:][:2] + "\x01"]
    stream = create(client, server, kind, max_tokens=max_tokens, temperature=0, extra_body=IGNORE_EOS, stop=stops,
                    stream=True)
    deltas, finish, _, _ = collect_stream(stream, kind)
    assert "".join(deltas) == reference
    assert finish == "length"


# -- 3. seeded sampling -----------------------------------------------------------------------------
def test_seed_reproducibility(server: SkippyServer, client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        r = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=24, temperature=1.0,
                                      seed=seed, extra_body=IGNORE_EOS)
        assert r.usage.completion_tokens == 24
        return r.choices[0].text

    first = sample(42)
    assert sample(42) == first
    assert sample(43) != first  # 24 tokens at temperature 1: a collision is vanishingly unlikely

    chat = [client.chat.completions.create(model=server.model_id, messages=CHAT, max_tokens=24, temperature=1.0,
                                           seed=42, extra_body=IGNORE_EOS).choices[0].message.content
            for _ in range(2)]
    assert chat[0] == chat[1]


def test_top_p_zero_is_greedy_at_any_temperature(server: SkippyServer, client: openai.OpenAI) -> None:
    """top_p 0 reaches llama.cpp's top-p sampler, which keeps the most likely token (never rewritten to 1)."""
    def text(temperature: float, top_p: float) -> str:
        r = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=24, seed=7,
                                      temperature=temperature, top_p=top_p, extra_body=IGNORE_EOS)
        return r.choices[0].text

    greedy = text(0, 1)
    assert text(1.0, 0) == greedy
    assert text(1.0, 1) != greedy  # the same seed really samples without it


# -- 4. logprobs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ignore_eos", [True, False])
def test_chat_logprobs(server: SkippyServer, client: openai.OpenAI, ignore_eos: bool) -> None:
    r = client.chat.completions.create(model=server.model_id, messages=CHAT, max_tokens=24, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": ignore_eos})
    content = r.choices[0].message.content
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens, "one logprobs entry per generated token"
    joined = b"".join(bytes(e.bytes) for e in entries)
    if "\ufffd" not in content:
        assert joined == content.encode()
    else:  # byte tokens that do not form valid UTF-8 show as U+FFFD in the content
        assert joined.decode("utf-8", "replace") == content
    for e in entries:
        assert e.logprob <= 0
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert all(t <= 0 for t in tops)
        same = [t for t in e.top_logprobs if bytes(t.bytes) == bytes(e.bytes)]
        if same:
            assert same[0].logprob == e.logprob
        assert e.logprob <= tops[0]
    # greedy: the chosen token is the most likely one
    assert all(bytes(e.top_logprobs[0].bytes) == bytes(e.bytes) for e in entries)


def test_chat_logprobs_off_by_default(server: SkippyServer, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=server.model_id, messages=CHAT, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs_shape(server: SkippyServer, client: openai.OpenAI) -> None:
    max_tokens = 12
    r = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                  logprobs=2, extra_body=IGNORE_EOS)
    text, lp = r.choices[0].text, r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert n == max_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert all(isinstance(t, str) for t in lp.tokens)
    assert all(x <= 0 for x in lp.token_logprobs)
    assert lp.text_offset[0] == 0
    for i in range(n - 1):
        assert lp.text_offset[i + 1] - lp.text_offset[i] == len(lp.tokens[i])
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 2  # keyed by text: two byte tokens may both render as U+FFFD
        assert all(v <= 0 for v in top.values())
        assert max(top.values()) == logprob  # greedy picks the most likely token
        if token in top:
            assert top[token] == logprob
    if "\ufffd" not in text:
        assert "".join(lp.tokens) == text


def test_completion_stream_logprobs(server: SkippyServer, client: openai.OpenAI) -> None:
    full = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=10, temperature=0,
                                     logprobs=1, extra_body=IGNORE_EOS)
    stream = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=10, temperature=0,
                                       logprobs=1, extra_body=IGNORE_EOS, stream=True)
    tokens, values = [], []
    for chunk in stream:
        lp = chunk.choices[0].logprobs
        if lp is not None:
            tokens += lp.tokens
            values += lp.token_logprobs
    assert tokens == full.choices[0].logprobs.tokens
    assert values == full.choices[0].logprobs.token_logprobs
