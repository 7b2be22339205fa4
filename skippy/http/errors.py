"""HTTP errors rendered in the OpenAI error envelope.

Handlers raise `HttpError`; the server (skippy.http.server) turns it into a response with the
error's status, headers and `{"error": {"message", "type", "param", "code"}}` JSON body.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> bytes:
    """The OpenAI error envelope as JSON bytes."""
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


class HttpError(Exception):
    """An error response: status, envelope fields and extra response headers (e.g. `Allow`)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers: list[tuple[str, str]] = list(headers)

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def invalid(param: str, message: str, code: str = "invalid_value") -> HttpError:
    """A 400 naming the request field (or part) `param` at fault."""
    return HttpError(400, f"{param}: {message}", param=param, code=code)
