"""Abandoned work stops: a client that goes away mid-prefill, mid-decode or while queued frees its lane at once.

One `skippy up` on the tiny llama, 2 stages, ONE lane and one generation permit, and prompts of ~2400 tokens
prefilled in chunks of 8 (hundreds of chunks, seconds of prefill). Each test sends a request on a raw
connection, waits (bounded polls) for an observable fact (progress chunks, stage 0's prefilled-token counter,
the broker's queue depth), hangs up, and then checks what stage 0 and the broker did: the request was counted
and logged as abandoned (`request_abandoned`, `skippy_driver_requests_abandoned_total{phase}`,
`skippy_broker_requests_abandoned_total{phase="queued"}`) with far fewer tokens prefilled than its prompt has,
it ended `cancelled` with no token generated (its prefill never finished), a new request then runs to its end
on the only lane, and the identical request sent again restores what the abandoned one prefilled
(`cached_tokens`, Anthropic's `cache_read_input_tokens`).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from up_helpers import SkippyServer, wait_idle

from skippy.launcher import read_events
from skippy.telemetry.scrape import scrape
from skippy.telemetry.targets import TARGETS_FILE, read_targets

CHUNK = 8  # prefill chunk size (fixed policy): a prompt takes len / CHUNK steps
PREFILLED = 128  # prompt tokens run before the client hangs up: past the prefix cache's min_tokens (64)
WORDS = 600  # words of a long prompt: ~2400 tokens of the tiny model's vocabulary
POLL_S = 0.02  # interval of the bounded polls below
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    with start_up("up-abandon", tiny_llama, "--lane-count", "1", "--ctx-size", "4096", "--no-speculative",
                  "--openai-generation-concurrency", "1", "--openai-generation-queue-capacity", "2",
                  "--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", str(CHUNK)) as s:
        yield s


def long_text(tag: str) -> str:
    """A prompt no other test's shares a prefix with."""
    return " ".join(f"{tag}{i}" for i in range(WORDS))


def metric(server: SkippyServer, process: str, name: str, **labels: str) -> float:
    url = dict(read_targets(server.run_dir / TARGETS_FILE))[process]
    samples = scrape(url, timeout_s=5.0)
    assert samples is not None, f"{process} /metrics did not answer"
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {DEADLINE_S:g} s: {what}")
        time.sleep(POLL_S)  # a bounded poll's interval


def events(server: SkippyServer, log: str, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(server.run_dir / log) if e.get("event") == name]


def send(server: SkippyServer, path: str, body: dict[str, Any]) -> http.client.HTTPConnection:
    """A request sent on its own connection, its response not read."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=DEADLINE_S)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    return conn


def hang_up(conn: http.client.HTTPConnection) -> None:
    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def abandoned_prefill(server: SkippyServer, seen: int) -> dict[str, Any]:
    """Stage 0's `request_abandoned` line for the request just abandoned (the `seen`+1-th), once its final event
    says how it ended."""
    wait_for("stage 0 logs the request abandoned", lambda: len(events(server, "stage0.log", "request_abandoned")) > seen)
    event = events(server, "stage0.log", "request_abandoned")[seen]
    rid = event["request_id"]
    wait_for("stage 0 ends it", lambda: any(e.get("request_id") == rid for e in events(server, "stage0.log", "request_done")))
    done = next(e for e in events(server, "stage0.log", "request_done") if e.get("request_id") == rid)
    assert event["phase"] == "prefill", event
    assert PREFILLED <= event["prefilled_tokens"] < event["prompt_tokens"] // 2, event  # far from its end
    assert done["finish_reason"] == "cancelled" and done["generated_tokens"] == 0, done  # its prefill never finished
    return event


def lane_is_free(server: SkippyServer) -> None:
    """The only lane runs a new request to its end: the abandoned one left it."""
    client = server.client()
    reply = client.completions.create(model=server.model_id, prompt="hi", max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
    client.close()


def test_abandoned_stream_stops_its_prefill_and_leaves_its_prefix(server: SkippyServer) -> None:
    seen = len(events(server, "stage0.log", "request_abandoned"))
    before = metric(server, "stage0", "skippy_driver_requests_abandoned_total", phase="prefill")
    messages = [{"role": "user", "content": long_text("c")}]
    conn = send(server, "/v1/chat/completions", {"model": server.model_id, "messages": messages, "max_tokens": 8,
                                                 "stream": True, "return_progress": True})
    resp = conn.getresponse()
    assert resp.status == 200
    processed = 0
    while processed < PREFILLED:  # the prompt's progress, chunk by chunk
        line = resp.readline()
        assert line, "the stream ended before its prompt had run far"
        if line.startswith(b"data: {"):
            progress = json.loads(line[6:]).get("prompt_progress")
            processed = progress["processed"] if progress else processed
    hang_up(conn)

    event = abandoned_prefill(server, seen)
    assert metric(server, "stage0", "skippy_driver_requests_abandoned_total", phase="prefill") == before + 1
    lane_is_free(server)
    client = server.client()
    again = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert again.usage.prompt_tokens == event["prompt_tokens"]
    assert again.usage.prompt_tokens_details.cached_tokens == event["prefilled_tokens"], (again.usage, event)
    client.close()


def test_abandoned_anthropic_stream_before_its_first_event(server: SkippyServer) -> None:
    """Claude Code's case: a long prompt streamed on /v1/messages, given up before anything came back."""
    seen = len(events(server, "stage0.log", "request_abandoned"))
    prefilled = metric(server, "stage0", "skippy_driver_prefill_tokens_total")
    body = {"model": server.model_id, "max_tokens": 8, "messages": [{"role": "user", "content": long_text("m")}]}
    conn = send(server, "/v1/messages", {**body, "stream": True})
    wait_for(f"{PREFILLED} prompt tokens prefilled",
             lambda: metric(server, "stage0", "skippy_driver_prefill_tokens_total") >= prefilled + PREFILLED)
    hang_up(conn)

    event = abandoned_prefill(server, seen)
    lane_is_free(server)
    again = server.request("POST", "/v1/messages", {**body, "max_tokens": 1}, timeout=DEADLINE_S)
    assert again.status == 200, again.body
    usage = again.json()["usage"]
    assert usage["cache_read_input_tokens"] == event["prefilled_tokens"], (usage, event)
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == event["prompt_tokens"], (usage, event)


def test_abandoned_responses_request_not_streamed(server: SkippyServer) -> None:
    seen = len(events(server, "stage0.log", "request_abandoned"))
    prefilled = metric(server, "stage0", "skippy_driver_prefill_tokens_total")
    conn = send(server, "/v1/responses", {"model": server.model_id, "input": long_text("r"), "max_output_tokens": 8})
    wait_for(f"{PREFILLED} prompt tokens prefilled",
             lambda: metric(server, "stage0", "skippy_driver_prefill_tokens_total") >= prefilled + PREFILLED)
    hang_up(conn)
    abandoned_prefill(server, seen)
    lane_is_free(server)


def test_abandoned_while_queued_leaves_the_broker_queue(server: SkippyServer) -> None:
    """A request waiting for the only permit behind a long generation leaves the queue when its client goes; the
    generation's own client then goes too (abandoned while decoding)."""
    wait_idle(server)
    queued = metric(server, "broker", "skippy_broker_requests_abandoned_total", phase="queued")
    decoding = metric(server, "stage0", "skippy_driver_requests_abandoned_total", phase="decode")
    blocker = send(server, "/v1/completions", {"model": server.model_id, "prompt": "Once upon a time", "max_tokens": 2000,
                                               "stream": True, "ignore_eos": True})
    stream = blocker.getresponse()
    assert stream.status == 200
    while not stream.readline().startswith(b"data: {"):  # its first token: it holds the permit
        pass
    waiter = send(server, "/v1/completions", {"model": server.model_id, "prompt": "hi", "max_tokens": 4})
    wait_for("a request waiting at the broker", lambda: server.request("GET", "/readyz").json().get("waiting") == 1)
    hang_up(waiter)
    wait_for("the broker counts it abandoned while queued",
             lambda: metric(server, "broker", "skippy_broker_requests_abandoned_total", phase="queued") == queued + 1)
    assert server.request("GET", "/readyz").json().get("waiting") == 0
    line = events(server, "broker.log", "request_abandoned")[-1]
    assert line["phase"] == "queued" and line["prefilled_tokens"] == 0, line

    hang_up(blocker)
    wait_for("stage 0 counts the generation abandoned while decoding",
             lambda: metric(server, "stage0", "skippy_driver_requests_abandoned_total", phase="decode") == decoding + 1)
    line = events(server, "stage0.log", "request_abandoned")[-1]
    assert line["phase"] == "decode" and 0 < line["generated_tokens"] < 2000, line
    wait_idle(server)
