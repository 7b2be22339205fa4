"""The HTTP API key: Bearer auth on the adapter's routes, a 401 in the OpenAI error envelope otherwise.

With a key (`skippy adapter --openai-api-key KEY`, or `$SKIPPY_OPENAI_API_KEY`; `skippy up` hands its
`--openai-api-key` to the adapter through that variable, never on a command line) every route wants
`Authorization: Bearer KEY`, except `/health` and `/readyz` (liveness and readiness probes, which say
nothing but up or down and the queue lengths) and CORS preflights (browsers send them without
credentials). Keys are compared in constant time; a refusal is logged by the server's `http_request`
line (401, without the key). Without a key the API is open, as before.
"""

from __future__ import annotations

import hmac
import os

from skippy.http.errors import HttpError
from skippy.http.routing import Handler, Request, Response, StreamResponse

__all__ = ["API_KEY_ENV", "OPEN_PATHS", "ApiKey", "api_key_from"]

API_KEY_ENV = "SKIPPY_OPENAI_API_KEY"
OPEN_PATHS = frozenset({"/health", "/readyz"})


def api_key_from(flag: str | None) -> str | None:
    """The key: the flag's value, else the environment's; None (or empty): no key, the API is open."""
    key = (flag if flag is not None else os.environ.get(API_KEY_ENV, "")).strip()
    return key or None


class ApiKey:
    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    def wrap(self, path: str, handler: Handler) -> Handler:
        """`handler` behind the key (unchanged without a key or on an open path)."""
        if self._key is None or path in OPEN_PATHS:
            return handler

        async def guarded(request: Request) -> Response | StreamResponse:
            self.check(request)
            return await handler(request)

        return guarded

    def check(self, request: Request) -> None:
        """Raise the 401 unless the request carries the key as a Bearer token."""
        assert self._key is not None
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("You didn't provide an API key. You need to provide your API key in an "
                                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
        if not hmac.compare_digest(token.strip().encode("latin-1"), self._key):  # the header's own bytes
            raise _unauthorized("Incorrect API key provided.")


def _unauthorized(message: str) -> HttpError:
    return HttpError(401, message, code="invalid_api_key", headers=[("www-authenticate", "Bearer")])
