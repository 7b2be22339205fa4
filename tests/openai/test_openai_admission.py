"""Admission through `skippy up` with one generation permit: a full queue and an admission timeout
give 429 + Retry-After, and a streaming client that disconnects frees its lane at once.

A "blocker" is a long streamed generation (LONG tokens, ignore_eos) whose first chunk has been
read: it is admitted and holds the only permit. LONG tokens take the tiny model seconds, the
requests racing it are sent within milliseconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SkippyServer, wait_idle

from skippy.launcher import read_events

CONCURRENCY = 1  # --lane-count 1: the broker clamps its concurrency to the lane count
QUEUE_CAPACITY = 2  # the broker accepts any capacity >= 0 when it is given explicitly
LONG = 1000  # tokens of a blocker (ctx 2048 for these servers)
LONGEST = 2000  # a blocker that only has to outlive an admission timeout (it is closed early)
PROMPT = "Once upon a time"
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def single_lane(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    with start_up("up-single-lane", tiny_llama, "--lane-count", "1", "--ctx-size", "2048",
                  "--openai-generation-concurrency", str(CONCURRENCY),
                  "--openai-generation-queue-capacity", str(QUEUE_CAPACITY)) as s:
        yield s


@pytest.fixture(scope="module")
def timeout_server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    with start_up("up-admission-timeout", tiny_llama, "--lane-count", "1", "--ctx-size", "2048",
                  "--openai-generation-concurrency", "1", "--openai-generation-queue-capacity", "4",
                  "--openai-generation-admission-timeout-secs", "0.5") as s:
        yield s


def start_blocker(client: openai.OpenAI, server: SkippyServer, max_tokens: int = LONG) -> tuple[Any, Iterator[Any]]:
    stream = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=max_tokens, stream=True,
                                       stream_options={"include_usage": True}, extra_body=IGNORE_EOS)
    chunks = iter(stream)
    assert next(chunks).choices[0].text is not None  # generating: it holds the permit
    return stream, chunks


def test_overload_gives_429_with_retry_after(single_lane: SkippyServer) -> None:
    extras = 3
    burst = CONCURRENCY + QUEUE_CAPACITY + extras
    client = single_lane.client()
    _, blocker = start_blocker(client, single_lane)

    def one(_: int) -> Any:
        c = single_lane.client()
        try:
            return c.completions.create(model=single_lane.model_id, prompt=PROMPT, max_tokens=200,
                                        extra_body=IGNORE_EOS)
        except openai.APIStatusError as exc:
            return exc
        finally:
            c.close()

    with ThreadPoolExecutor(burst - CONCURRENCY) as pool:
        futures = [pool.submit(one, i) for i in range(burst - CONCURRENCY)]
        blocker_usage = [chunk.usage for chunk in blocker if chunk.usage is not None]
        results = [f.result(timeout=120) for f in futures]

    assert len(blocker_usage) == 1 and blocker_usage[0].completion_tokens == LONG
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    done = [r for r in results if not isinstance(r, openai.APIStatusError)]
    assert len(refused) == extras, [str(r) for r in refused]
    for exc in refused:
        assert isinstance(exc, openai.RateLimitError), exc
        assert exc.status_code == 429
        assert exc.response.headers.get("retry-after") == "1"
        assert "queue full" in exc.message
        assert exc.code == "queue_full"
        assert exc.type == "rate_limit_error"
    assert len(done) == QUEUE_CAPACITY
    for r in done:
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 200
    client.close()
    wait_idle(single_lane)


def test_admission_timeout_gives_429(timeout_server: SkippyServer) -> None:
    client = timeout_server.client()
    stream, _ = start_blocker(client, timeout_server, LONGEST)
    try:
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model=timeout_server.model_id, max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    finally:
        stream.close()  # disconnect: frees the lane
    exc = info.value
    assert exc.status_code == 429
    assert exc.code == "admission_timeout"
    assert exc.response.headers.get("retry-after") == "1"
    assert "waited 0.5 s" in exc.message and "slot" in exc.message
    wait_idle(timeout_server)
    after = client.chat.completions.create(model=timeout_server.model_id, max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert after.usage.completion_tokens >= 1
    client.close()


def test_disconnected_stream_frees_its_lane(single_lane: SkippyServer) -> None:
    """With one permit, a new request can only run once the abandoned stream's generation is cancelled."""
    client = single_lane.client()
    stream = client.chat.completions.create(model=single_lane.model_id, max_tokens=LONG, stream=True,
                                            messages=[{"role": "user", "content": "tell me a long story"}],
                                            extra_body=IGNORE_EOS, extra_headers={"x-request-id": "walk-away"})
    chunks = iter(stream)
    assert next(chunks).choices[0].delta.role == "assistant"
    assert next(chunks).choices[0].delta.content is not None
    stream.close()

    fresh = single_lane.client(timeout=60.0)
    r = fresh.chat.completions.create(model=single_lane.model_id, max_tokens=8, extra_body=IGNORE_EOS,
                                      messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    fresh.close()
    client.close()

    # ...and it ran because the abandoned generation was cancelled, not because it had finished.
    started = [e for e in read_events(single_lane.run_dir / "adapter.log")
               if e.get("event") == "generation_started" and e.get("request_id") == "walk-away"]
    assert len(started) == 1
    generation_id = started[0]["generation_id"]
    deadline = time.monotonic() + 30
    while True:
        done = [e for e in read_events(single_lane.run_dir / "broker.log")
                if e.get("event") == "request_done" and e.get("request_id") == generation_id]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # bounded poll of the broker's log file
    assert done, "the broker never finished the abandoned request"
    assert done[0]["finish_reason"] == "cancelled"
    assert done[0]["tokens"] < LONG
    # every line the adapter and the broker wrote is a JSON event, the HTTP server's own lines included
    for name in ("adapter.log", "broker.log"):
        lines = (single_lane.run_dir / name).read_text().splitlines()
        assert lines and all(line.startswith("{") and "event" in json.loads(line) for line in lines), name
    assert any(e.get("event") == "http_request" for e in read_events(single_lane.run_dir / "adapter.log"))
