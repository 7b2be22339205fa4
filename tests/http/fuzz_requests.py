"""Hypothesis strategies for raw HTTP/1.1 requests to the adapter, and a raw client that sends one.

A `RawRequest` is a method (known or any token), a path (the adapter's routes, with queries, or any
path), random headers, a body (bytes, any JSON, chat / completion requests with random and
wrong-typed fields, out-of-range sampling values, or hostile JSON: nested thousands deep, integers of
thousands of digits, NaN, invalid UTF-8, lone surrogates) and its framing: Content-Length or
chunked, whole or cut short, none, or plain garbage instead of a request. `exchange` sends it on a
fresh connection (ending our side when the request is cut short or garbage, so the server sees the
truncation) and returns the status of the server's answer, or None when it closed without one.
"""

from __future__ import annotations

import json
import socket
import string
import time
from dataclasses import dataclass

from hypothesis import strategies as st

ROUTES = ("/health", "/readyz", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize",
          "/detokenize", "/dashboard", "/dashboard/data", "/dashboard/dashboard.js")
TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
HEADER_TEXT = "".join(chr(c) for c in range(0x20, 0x7F)) + "\t\u00e9\u00ff"
FRAMING_HEADERS = ("content-length", "transfer-encoding", "host")
ANSWER_WITHIN_S = 20.0  # a bound on waiting for the server (not a timing claim)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]) | JSON,
                                 "content": st.text(max_size=40) | JSON})
COMMON = {"max_tokens": st.integers(-3, 40) | JSON, "stream": st.booleans() | JSON, "temperature": st.floats(-1, 3) | JSON,
          "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | JSON, "logprobs": st.booleans() | JSON,
          "top_logprobs": st.integers(-2, 30) | JSON, "n": st.integers(0, 3) | JSON, "seed": st.integers() | JSON,
          "response_format": JSON, "tools": JSON, "stream_options": JSON, "logit_bias": JSON,
          **{name: st.floats() | st.integers() | JSON for name in (
              "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")}}
CHAT = st.fixed_dictionaries({"model": st.just("tiny") | JSON, "messages": st.lists(MESSAGE, max_size=3) | JSON},
                             optional=COMMON)
COMPLETION = st.fixed_dictionaries({"model": st.just("tiny") | JSON, "prompt": st.text(max_size=40) | JSON},
                                   optional=COMMON)
VALID = {"max_tokens": st.integers(1, 20), "stream": st.booleans(), "temperature": st.floats(0, 2),
         "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2), "logprobs": st.booleans(),
         "top_logprobs": st.integers(0, 5), "seed": st.integers(0, 2**31)}
PLAUSIBLE = st.fixed_dictionaries(
    {"model": st.just("tiny"), "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=40)}), min_size=1, max_size=3)},
    optional=VALID) | st.fixed_dictionaries({"model": st.just("tiny"), "prompt": st.text(max_size=40)}, optional=VALID)
NESTED = st.integers(100, 20_000).flatmap(lambda n: st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n]))
HOSTILE_VALUES = st.sampled_from([b"9" * 5000, b"1e400", b"-1e400", b"NaN", b"-Infinity", b'"\\ud800"', b'"\xff\xfe"',
                                  b"[" * 300 + b"]" * 300])
HOSTILE = NESTED | st.builds(  # one field of a generation request made hostile
    lambda base, name, value: json.dumps(base).encode()[:-1] + b', "' + name.encode() + b'": ' + value + b"}",
    st.fixed_dictionaries({"model": st.just("tiny"), "prompt": st.just("hi")}),
    st.sampled_from(["temperature", "top_p", "top_k", "max_tokens", "seed", "prompt2", "metadata", "logit_bias"]),
    HOSTILE_VALUES)
BODY = st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()) | (CHAT | COMPLETION).map(
    lambda v: json.dumps(v).encode()) | HOSTILE
FRAMINGS = ("length", "chunked", "length-cut", "chunked-cut", "none", "garbage")


@dataclass(frozen=True)
class RawRequest:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    framing: str
    chunks: tuple[int, ...]  # chunk sizes for chunked framing
    cut: int  # bytes dropped from the end of a cut-short request
    garbage: bytes

    @property
    def complete(self) -> bool:
        return self.framing in ("length", "chunked", "none")

    def raw(self) -> bytes:
        if self.framing == "garbage":
            return self.garbage
        head = [f"{self.method} {self.path} HTTP/1.1", "Host: fuzz", *(f"{k}: {v}" for k, v in self.headers)]
        body = self.body
        if self.framing.startswith("length"):
            head.append(f"Content-Length: {len(body)}")
        elif self.framing.startswith("chunked"):
            head.append("Transfer-Encoding: chunked")
            body = _chunked(body, self.chunks)
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body if self.framing != "none" else b"")
        return data[:max(1, len(data) - self.cut)] if self.framing.endswith("-cut") else data


def _chunked(body: bytes, sizes: tuple[int, ...]) -> bytes:
    out, at = [], 0
    for size in (*sizes, len(body)):
        piece = body[at:at + max(1, size)]
        if piece:
            out.append(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        at += len(piece)
    return b"".join(out) + b"0\r\n\r\n"


@st.composite
def raw_requests(draw: st.DrawFn) -> RawRequest:
    """Anything (below), or one time in four a well-framed generation request that is nearly valid, or one
    time in four a well-framed POST of hostile JSON to a route that reads JSON."""
    pick = draw(st.integers(0, 3))
    if pick < 2:
        path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"] + ["/tokenize", "/detokenize"] * pick))
        body = json.dumps(draw(PLAUSIBLE)).encode() if pick == 0 else draw(HOSTILE)
        return RawRequest("POST", path, (), body, draw(st.sampled_from(["length", "chunked"])),
                          tuple(draw(st.lists(st.integers(1, 64), max_size=4))), 0, b"")
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])
                  | st.text(TOKEN, min_size=1, max_size=8))
    path = draw(st.sampled_from(ROUTES) | st.builds(lambda r, q: f"{r}?{q}", st.sampled_from(ROUTES),
                                                   st.text(TOKEN + "=&%", max_size=20))
                | st.text(string.printable.strip() + "%", max_size=30).map(lambda p: "/" + p.replace(" ", "%20")))
    names = st.text(TOKEN, min_size=1, max_size=16).filter(lambda n: n.lower() not in FRAMING_HEADERS)
    headers = draw(st.lists(st.tuples(names, st.text(HEADER_TEXT, max_size=30).map(str.strip)), max_size=5))
    if draw(st.booleans()):
        headers.append(("Content-Type", draw(st.sampled_from(["application/json", "text/plain", ""]))))
    return RawRequest(method, path, tuple(headers), draw(BODY), draw(st.sampled_from(FRAMINGS)),
                      tuple(draw(st.lists(st.integers(1, 64), max_size=4))), draw(st.integers(1, 40)),
                      draw(st.binary(min_size=1, max_size=120)))


def exchange(port: int, request: RawRequest) -> int | None:
    """Send `request` on a fresh connection; the final status of the answer, or None if closed without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as conn:
        conn.sendall(request.raw())
        if not request.complete:
            conn.shutdown(socket.SHUT_WR)
        return read_status(conn)


def read_status(conn: socket.socket) -> int | None:
    """The first non-1xx status line's code (None at EOF before one); bounded by ANSWER_WITHIN_S."""
    deadline, data = time.monotonic() + ANSWER_WITHIN_S, b""
    while True:
        while b"\r\n\r\n" not in data:
            assert time.monotonic() < deadline, f"no answer within {ANSWER_WITHIN_S:g} s (got {data[:80]!r})"
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            return status
