"""Error handling of the OpenAI adapter under `skippy up`: OpenAI error envelopes with the right
status, type, param and code; routing errors; size limits; malformed HTTP over raw sockets (the
server answers with the status naming the problem, then closes, and keeps serving others); the
/readyz and /metrics figures."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import openai
import pytest
from up_helpers import RawResponse, SkippyServer, wait_idle

CHAT = [{"role": "user", "content": "hello"}]


def assert_envelope(resp: RawResponse, status: int, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    assert resp.status == status, resp.body[:300]
    assert resp.headers.get("content-type", "").startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param
        assert param in err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def chat_body(server: SkippyServer, **fields: Any) -> dict[str, Any]:
    return {"model": server.model_id, "messages": CHAT, "max_tokens": 4, **fields}


def health_ok(server: SkippyServer) -> None:
    resp = server.request("GET", "/health")
    assert resp.status == 200 and resp.json() == {"status": "ok"}


def raw_exchange(server: SkippyServer, data: bytes, *, shutdown_write: bool = True,
                 timeout: float = 15.0) -> RawResponse:
    """Send raw bytes on a fresh connection (then end our side unless `shutdown_write` is False), read the
    one response, and check that the server then closes the connection. A reset or a close without a
    response fails the test."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(data)
        if shutdown_write:
            sock.shutdown(socket.SHUT_WR)
        resp = http.client.HTTPResponse(sock)
        resp.begin()  # http.client.RemoteDisconnected here: the server closed without answering
        raw = RawResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        assert raw.headers.get("connection") == "close", raw.headers
        assert sock.recv(1) == b"", "the server must close the connection after the error"
    return raw


# -- OpenAI-level errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_unknown_model_is_404_model_not_found(server: SkippyServer, client: openai.OpenAI, kind: str) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        if kind == "chat":
            client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=4)
        else:
            client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"


def test_unknown_model_in_stream_mode_fails_before_streaming(server: SkippyServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=4, stream=True)
    assert (info.value.code, info.value.param) == ("model_not_found", "model")
    # a plain JSON error, not an event stream that opened with 200 and then failed
    resp = server.request("POST", "/v1/chat/completions", body={"model": "no-such-model", "messages": CHAT,
                                                                 "max_tokens": 4, "stream": True})
    err = assert_envelope(resp, 404, param="model", code="model_not_found")
    assert "no-such-model" in err["message"] and b"data:" not in resp.body


def test_bad_json_is_400_envelope(server: SkippyServer) -> None:
    resp = server.request("POST", "/v1/chat/completions", body=b'{"model": "x", "messages": [')
    err = assert_envelope(resp, 400, code="invalid_json")
    assert err["type"] == "invalid_request_error"
    assert_envelope(server.request("POST", "/v1/completions", body=b"\xff\xfe not utf-8"), 400, code="invalid_json")
    assert_envelope(server.request("POST", "/v1/completions", body=b"[1, 2]"), 400)


@pytest.mark.parametrize(("field", "value", "param"), [
    ("temperature", "hot", "temperature"),
    ("messages", "hi", "messages"),
    ("messages", [], "messages"),
    ("max_tokens", -1, "max_tokens"),
    ("max_tokens", 1.5, "max_tokens"),
    ("top_p", 7, "top_p"),
    ("stream", "yes", "stream"),
    ("stop", 3, "stop"),
    ("seed", "x", "seed"),
    ("logit_bias", {"abc": 1}, "logit_bias"),
    ("top_logprobs", 3, "top_logprobs"),  # without logprobs: true
    # out of range: refused, never rewritten (ranges: skippy.adapter.openai_request)
    *((name, value, name) for name, value in [
        ("top_p", -0.1), ("top_p", 1.5), ("temperature", -1), ("temperature", 2.5), ("temperature", 10**400),
        ("min_p", 1.5), ("top_k", -1), ("top_k", 2**31), ("top_k", 0.5), ("repeat_penalty", 0),
        ("repeat_penalty", -1), ("frequency_penalty", 2.5), ("presence_penalty", -3), ("n", 0)]),
])
def test_wrong_types_are_400_naming_the_param(server: SkippyServer, field: str, value: Any, param: str) -> None:
    resp = server.request("POST", "/v1/chat/completions", body=chat_body(server, **{field: value}))
    err = assert_envelope(resp, 400, param=param)
    assert err["type"] == "invalid_request_error"


def test_wrong_type_through_official_client(server: SkippyServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model_id, messages=CHAT, max_tokens=4,
                                       temperature="hot")  # type: ignore[arg-type]
    assert info.value.status_code == 400 and info.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model_id, prompt="", max_tokens=4)
    assert info.value.param == "prompt"


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_prompt_longer_than_context_is_context_length_exceeded(server: SkippyServer, client: openai.OpenAI,
                                                              kind: str) -> None:
    words = " ".join(["the quick brown fox jumps over the lazy dog"] * 250)  # > the tiny GGUF's 2048-token context
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": words}],
                                           max_tokens=4)
        else:
            client.completions.create(model=server.model_id, prompt=words, max_tokens=4)
    assert info.value.status_code == 400
    assert info.value.code == "context_length_exceeded"
    assert info.value.param == ("messages" if kind == "chat" else "prompt")
    assert isinstance(info.value.body, dict) and info.value.body["message"].startswith(
        f"This model's maximum context length is 2048 tokens. However, your {info.value.param} resulted in ")


def test_n_greater_than_one_is_400(server: SkippyServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model_id, messages=CHAT, max_tokens=4, n=2)
    assert info.value.status_code == 400 and info.value.param == "n"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model_id, prompt=["a", "b"], max_tokens=4)
    assert info.value.status_code == 400 and info.value.param == "prompt" and "several prompts" in info.value.message


# -- routing and HTTP-level errors ------------------------------------------------------------------
def test_unknown_route_is_404(server: SkippyServer) -> None:
    assert_envelope(server.request("GET", "/v1/nope"), 404, code="not_found")
    assert_envelope(server.request("POST", "/v1/embeddings", body={"model": server.model_id, "input": "x"}), 404)


def test_get_on_post_route_is_405(server: SkippyServer) -> None:
    resp = server.request("GET", "/v1/chat/completions")
    assert_envelope(resp, 405, code="method_not_allowed")
    assert resp.headers.get("allow") == "OPTIONS, POST"  # every route answers CORS preflights
    assert server.request("POST", "/health", body=b"{}").status == 405


def test_body_over_4_mib_is_413(server: SkippyServer) -> None:
    big = b'{"model": "x", "prompt": "' + b"a" * (4 << 20) + b'"}'
    err = assert_envelope(server.request("POST", "/v1/completions", body=big), 413, code="request_too_large")
    assert err["message"] == f"request body over {4 << 20} bytes"
    health_ok(server)


def test_chunked_body_over_4_mib_is_413(server: SkippyServer) -> None:
    """4 MiB + 1 KiB of chunked body, never ended: the 413 comes as soon as the limit is passed."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    mib = b"100000\r\n" + b"a" * (1 << 20) + b"\r\n"
    resp = raw_exchange(server, head + mib * 4 + b"400\r\n" + b"a" * 1024 + b"\r\n", shutdown_write=False)
    err = assert_envelope(resp, 413, code="request_too_large")
    assert err["message"] == f"request body over {4 << 20} bytes"
    health_ok(server)


@pytest.mark.parametrize("line", [b"THIS IS NOT HTTP", b"\x00\x01\x02\x03garbage"])
def test_malformed_request_line_is_400(server: SkippyServer, line: bytes) -> None:
    err = assert_envelope(raw_exchange(server, line + b"\r\n\r\n"), 400, code="bad_request")
    assert err["message"] == f"malformed request: illegal request line: {bytearray(line)!r}"
    health_ok(server)


def test_unsupported_http_version_is_505(server: SkippyServer) -> None:
    err = assert_envelope(raw_exchange(server, b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"), 505,
                          code="http_version_not_supported")
    assert err["message"] == "HTTP version 9.9 not supported (HTTP/1.0 and HTTP/1.1 are)"
    health_ok(server)


def test_huge_headers_are_431(server: SkippyServer) -> None:
    data = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    err = assert_envelope(raw_exchange(server, data), 431, code="request_headers_too_large")
    assert err["message"] == "request headers too large"
    health_ok(server)


def test_truncated_body_is_400_naming_what_arrived(server: SkippyServer) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    err = assert_envelope(raw_exchange(server, head + b'{"model": "'), 400, code="bad_request")
    assert err["message"] == ("malformed request: peer closed connection without sending complete message body "
                              "(received 11 bytes, expected 100)")
    health_ok(server)


def test_keep_alive_serves_several_requests_on_one_connection(server: SkippyServer) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        sockets = []
        for _ in range(3):
            conn.request("GET", "/health")
            resp = conn.getresponse()
            assert resp.status == 200
            assert resp.read() == b'{"status": "ok"}' and not resp.will_close
            sockets.append(conn.sock)
        assert sockets[0] is not None and sockets == [sockets[0]] * 3  # one connection, never reopened
    finally:
        conn.close()


# -- request ids ----------------------------------------------------------------------------------
def test_x_request_id_is_echoed(server: SkippyServer, client: openai.OpenAI) -> None:
    assert server.request("GET", "/health", headers={"x-request-id": "req-123"}).headers["x-request-id"] == "req-123"
    err = server.request("GET", "/v1/nope", headers={"x-request-id": "req-404"})
    assert err.status == 404 and err.headers["x-request-id"] == "req-404"
    raw = client.chat.completions.with_raw_response.create(
        model=server.model_id, messages=CHAT, max_tokens=2, extra_headers={"x-request-id": "chat-abc"})
    assert raw.headers["x-request-id"] == "chat-abc"
    assert raw.parse().choices[0].message.content is not None
    with client.completions.with_streaming_response.create(
            model=server.model_id, prompt="hi", max_tokens=2, stream=True,
            extra_headers={"x-request-id": "stream-abc"}) as resp:
        assert resp.headers["x-request-id"] == "stream-abc"
    generated = server.request("GET", "/health").headers["x-request-id"]
    assert len(generated) == 32 and generated != server.request("GET", "/health").headers["x-request-id"]


def metrics(server: SkippyServer) -> dict[str, float]:
    """/metrics as {sample name with labels: value} (Prometheus text format)."""
    resp = server.request("GET", "/metrics")
    assert resp.status == 200 and resp.headers["content-type"] == "text/plain; version=0.0.4"
    samples = [line.rpartition(" ") for line in resp.body.decode().splitlines() if not line.startswith("#")]
    return {name: float(value) for name, _, value in samples}


def test_readyz_and_metrics(server: SkippyServer, client: openai.OpenAI) -> None:
    wait_idle(server)  # what earlier tests cancelled has left the pipeline (and stopped counting tokens)
    ready = server.request("GET", "/readyz")
    assert ready.status == 200 and ready.json() == {"status": "ready", "running": 0, "waiting": 0}
    before = metrics(server)
    assert {k: before[k] for k in ("skippy_pipeline_ready", "skippy_generation_concurrency",
                                   "skippy_requests_running", "skippy_requests_waiting")} == {
        "skippy_pipeline_ready": 1.0, "skippy_generation_concurrency": 2.0,  # --openai-generation-concurrency 2
        "skippy_requests_running": 0.0, "skippy_requests_waiting": 0.0}

    done = client.completions.create(model=server.model_id, prompt="hi there", max_tokens=3,
                                     extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=3)
    after = metrics(server)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    route = 'skippy_http_requests_total{route="%s",status="%d"}'
    assert grew(route % ("/v1/completions", 200)) == 1 and grew(route % ("/v1/completions", 404)) == 1
    assert grew(route % ("/metrics", 200)) == 1  # the first scrape, counted once it was answered
    assert grew("skippy_prompt_tokens_total") == done.usage.prompt_tokens
    assert grew("skippy_completion_tokens_total") == 3
    # straight from stage 0, a message per step at most: 3 tokens and the final event with the last (fewer steps
    # when a window's drafts were accepted)
    assert 1 <= grew("skippy_direct_token_events_total") <= 3
    assert grew("skippy_time_to_first_token_seconds_count") == 1
    assert grew('skippy_time_to_first_token_seconds_bucket{le="+Inf"}') == 1
    assert grew("skippy_time_to_first_token_seconds_sum") > 0
