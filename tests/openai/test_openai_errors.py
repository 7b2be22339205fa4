"""Error handling of the OpenAI adapter under `skippy up`: OpenAI error envelopes with the right
status, type, param and code; routing errors; size limits; malformed HTTP over raw sockets (the
server must answer 4xx or close, and keep serving)."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import openai
import pytest
from up_helpers import RawResponse, SkippyServer

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


def raw_exchange(server: SkippyServer, data: bytes, *, shutdown_write: bool = True, timeout: float = 15.0) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it (b"" if it says nothing)."""
    received = b""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            if shutdown_write:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before it has read everything
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def assert_4xx_or_closed(received: bytes) -> None:
    if received:
        status_line = received.split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1.1 4"), status_line


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
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=4, stream=True)


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
    words = " ".join(["the quick brown fox jumps over the lazy dog"] * 67)  # ~600 words > ctx 512 tokens
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": words}],
                                           max_tokens=4)
        else:
            client.completions.create(model=server.model_id, prompt=words, max_tokens=4)
    assert info.value.status_code == 400
    assert info.value.code == "context_length_exceeded"
    assert info.value.param == ("messages" if kind == "chat" else "prompt")
    assert "512" in info.value.message


def test_n_greater_than_one_is_400(server: SkippyServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model_id, messages=CHAT, max_tokens=4, n=2)
    assert info.value.status_code == 400 and info.value.param == "n"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model_id, prompt=["a", "b"], max_tokens=4)


# -- routing and HTTP-level errors ------------------------------------------------------------------
def test_unknown_route_is_404(server: SkippyServer) -> None:
    assert_envelope(server.request("GET", "/v1/nope"), 404, code="not_found")
    assert_envelope(server.request("POST", "/v1/embeddings", body={"model": server.model_id, "input": "x"}), 404)


def test_get_on_post_route_is_405(server: SkippyServer) -> None:
    resp = server.request("GET", "/v1/chat/completions")
    assert_envelope(resp, 405, code="method_not_allowed")
    assert resp.headers.get("allow") == "POST"
    assert server.request("POST", "/health", body=b"{}").status == 405


def test_body_over_4_mib_is_413(server: SkippyServer) -> None:
    big = b'{"model": "x", "prompt": "' + b"a" * (4 << 20) + b'"}'
    assert_envelope(server.request("POST", "/v1/completions", body=big), 413)
    health_ok(server)


def test_chunked_body_over_4_mib_is_413(server: SkippyServer) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        chunks = (b"a" * (1 << 20) for _ in range(5))
        conn.request("POST", "/v1/completions", body=chunks, headers={"content-type": "application/json"},
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
        resp.read()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close before the rest of the body is sent: also a refusal
    finally:
        conn.close()
    health_ok(server)


def test_malformed_request_line(server: SkippyServer) -> None:
    assert_4xx_or_closed(raw_exchange(server, b"THIS IS NOT HTTP\r\n\r\n"))
    assert_4xx_or_closed(raw_exchange(server, b"GET / HTTP/9.9\r\nHost: x\r\n\r\n"))
    assert_4xx_or_closed(raw_exchange(server, b"\x00\x01\x02\x03garbage\r\n\r\n"))
    health_ok(server)


def test_huge_headers(server: SkippyServer) -> None:
    data = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    received = raw_exchange(server, data)
    assert_4xx_or_closed(received)
    if received:
        assert received.startswith(b"HTTP/1.1 431")
    health_ok(server)


def test_truncated_body(server: SkippyServer) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    assert_4xx_or_closed(raw_exchange(server, head + b'{"model": "'))
    health_ok(server)


def test_keep_alive_serves_several_requests_on_one_connection(server: SkippyServer) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        for _ in range(3):
            conn.request("GET", "/health")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read()
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


def test_readyz_and_metrics(server: SkippyServer) -> None:
    ready = server.request("GET", "/readyz")
    assert ready.status == 200 and ready.json()["status"] == "ready"
    metrics = server.request("GET", "/metrics")
    assert metrics.status == 200 and metrics.headers["content-type"].startswith("text/plain")
