"""Between h11 and what handlers see: a request's head read into a `Request` and checked against
the server's limits, a response head written, the error responses for requests the server will not
serve (400 malformed, 408 too slow, 413, 431, 503 too many connections, 505), and the one
`http_request` log line per request.

Pure functions over h11 events; the connection loop that drives them is skippy.http.server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote

import h11

from skippy.http.errors import HttpError
from skippy.http.routing import Request, Response
from skippy.log import module_logger

__all__ = [
    "body_too_large",
    "check_head",
    "close_stream",
    "error_response",
    "log_request",
    "protocol_error",
    "read_request",
    "request_id_for",
    "refusal_bytes",
    "request_timeout",
    "response_head",
    "too_many_connections",
]

log = module_logger(component="http")

_RESERVED = frozenset({"content-length", "transfer-encoding", "x-request-id"})


def request_id_for(raw: str | None) -> str:
    """The client's x-request-id reduced to printable non-space ASCII (<= 128 chars), else a fresh uuid4 hex."""
    clean = "".join(ch for ch in raw or "" if " " < ch <= "~")[:128]
    return clean or uuid.uuid4().hex


def read_request(head: h11.Request) -> Request:
    """The request a handler sees (body still empty): repeated headers joined, path unquoted."""
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    path, _, query = head.target.decode("latin-1").partition("?")
    query_args = dict(parse_qsl(query, keep_blank_values=True))
    method = head.method.decode("ascii").upper()
    return Request(method, unquote(path) or "/", query_args, headers, b"", request_id_for(headers.get("x-request-id")))


def check_head(head: h11.Request, *, max_header_bytes: int, max_body_bytes: int) -> None:
    """Refuse (HttpError) an HTTP version other than 1.0/1.1, oversized headers or a declared oversized body."""
    if head.http_version not in (b"1.0", b"1.1"):
        version = head.http_version.decode("ascii", "replace")
        raise HttpError(505, f"HTTP version {version} not supported (HTTP/1.0 and HTTP/1.1 are)",
                        type="server_error", code="http_version_not_supported")
    size = len(head.target) + sum(len(name) + len(value) + 4 for name, value in head.headers)
    if size > max_header_bytes:
        raise _headers_too_large()
    length = dict(head.headers).get(b"content-length")
    if length is not None and int(length) > max_body_bytes:
        raise body_too_large(max_body_bytes)


def protocol_error(exc: h11.RemoteProtocolError) -> HttpError:
    """What to answer a request h11 could not parse: 431 for oversized headers, else 400."""
    if exc.error_status_hint == 431:
        return _headers_too_large()
    return HttpError(400, f"malformed request: {exc}", code="bad_request")


def _headers_too_large() -> HttpError:
    return HttpError(431, "request headers too large", code="request_headers_too_large")


def body_too_large(limit: int) -> HttpError:
    return HttpError(413, f"request body over {limit} bytes", code="request_too_large")


def request_timeout(part: str, seconds: float) -> HttpError:
    """A request `part` (head or body) that did not arrive whole within its deadline."""
    return HttpError(408, f"request {part} not received within {seconds:g} s", code="request_timeout")


def too_many_connections(limit: int) -> HttpError:
    return HttpError(503, f"too many open connections (at most {limit}); retry later", type="service_unavailable",
                     code="too_many_connections", headers=[("retry-after", "1")])


def refusal_bytes(exc: HttpError) -> bytes:
    """`exc` as a whole response on the wire, with `Connection: close`, for a connection never read."""
    conn = h11.Connection(h11.SERVER)
    resp = error_response(exc)
    head = response_head(exc.status, request_id_for(None), [*resp.headers, ("connection", "close")],
                         resp.content_type, len(resp.body))
    return b"".join(conn.send(event) or b"" for event in (head, h11.Data(data=resp.body), h11.EndOfMessage()))


def error_response(exc: HttpError) -> Response:
    return Response(exc.status, exc.body(), list(exc.headers))


def response_head(status: int, request_id: str, headers: Sequence[tuple[str, str]], content_type: str,
                  length: int | None) -> h11.Response:
    """The h11 response head: the handler's headers (framing ones dropped), content type and length
    (None: chunked), and the request id."""
    out = [(name, value) for name, value in headers if name.lower() not in _RESERVED]
    if content_type and all(name.lower() != "content-type" for name, _ in out):
        out.append(("content-type", content_type))
    if length is not None:
        out.append(("content-length", str(length)))
    out.append(("x-request-id", request_id))
    return h11.Response(status_code=status, headers=out)


async def close_stream(chunks: AsyncIterator[bytes], req: Request) -> None:
    """Close the stream's generator so its `finally:` runs even when we stopped mid-stream."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.exception("http_stream_close_error", request_id=req.request_id)


def log_request(req: Request, status: int, started: float, **extra: Any) -> None:
    """The one `http_request` line per request (warning level for error statuses)."""
    duration_ms = round((time.monotonic() - started) * 1000, 3)
    (log.warning if status >= 400 else log.info)(
        "http_request", method=req.method, path=req.path, status=status, request_id=req.request_id,
        duration_ms=duration_ms, **extra,
    )
