"""The HTTP API key: Bearer auth on the adapter's routes, a 401 in the OpenAI error envelope otherwise.

With a key (`$SKIPPY_OPENAI_API_KEY`, `--openai-api-key-file PATH`, or `--openai-api-key KEY`, which
leaves it on a command line; skippy.config.api_key) every route wants `Authorization: Bearer KEY` (or
`x-api-key: KEY`, as Anthropic's clients send it),
except `/health` and `/readyz` (liveness and readiness probes, which say nothing but up or down and
the queue lengths) and CORS preflights (browsers send them without credentials). Every route of the
adapter goes through `wrap`, the dashboard's too (the adapter has one route table).

A browser cannot put a Bearer header on a page it opens, so the dashboard's routes (`browser=True`:
`/dashboard`, its script and style, `/dashboard/data`) also take the key once as a query,
`/dashboard?key=KEY`: the answer is a 303 back to the same URL without the key, setting the cookie
`skippy_dashboard` (HttpOnly, SameSite=Strict, Path=/dashboard), which the page's own requests then
carry. The cookie holds an HMAC of a fixed label under the key, not the key, and opens only the
dashboard's routes (never /v1/*, /metrics or /tokenize). A Bearer-authenticated dashboard request
sets the same cookie. Keys and cookies are compared in constant time; a refusal is logged by the
server's `http_request` line (401; the query is never logged). Without a key everything is open.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from skippy.config.api_key import API_KEY_ENV, api_key_from, bearer_matches, bearer_token
from skippy.http.errors import HttpError
from skippy.http.routing import Handler, Request, Response, StreamResponse

__all__ = ["API_KEY_ENV", "DASHBOARD_COOKIE", "OPEN_PATHS", "ApiKey", "api_key_from"]

OPEN_PATHS = frozenset({"/health", "/readyz"})
DASHBOARD_COOKIE = "skippy_dashboard"
_COOKIE_LABEL = b"skippy dashboard cookie v1"


class ApiKey:
    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None
        self._cookie = hmac.new(self._key, _COOKIE_LABEL, hashlib.sha256).hexdigest() if self._key else None

    def wrap(self, path: str, handler: Handler, *, browser: bool = False) -> Handler:
        """`handler` behind the key (unchanged without a key or on an open path); `browser`: a dashboard
        route, which also takes the `?key=` query and the dashboard cookie."""
        if self._key is None or path in OPEN_PATHS:
            return handler

        async def guarded(request: Request) -> Response | StreamResponse:
            self.check(request)
            return await handler(request)

        async def guarded_page(request: Request) -> Response | StreamResponse:
            if self._has_cookie(request):
                return await handler(request)
            if "key" in request.query:
                if not bearer_matches(request.query["key"], self._key or b""):
                    raise _unauthorized("Incorrect API key provided.")
                return Response(303, b"", [("location", _without_key(request)), self._set_cookie()], content_type="")
            self.check(request)
            response = await handler(request)
            response.headers.append(self._set_cookie())
            return response

        return guarded_page if browser else guarded

    def check(self, request: Request) -> None:
        """Raise the 401 unless the request carries the key as a Bearer token."""
        assert self._key is not None
        token = bearer_token(request.headers.get("authorization", "")) or request.headers.get("x-api-key") or None
        if token is None:
            raise _unauthorized("You didn't provide an API key. You need to provide your API key in an "
                                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)"
                                " or as x-api-key (Anthropic's header).")
        if not bearer_matches(token, self._key):
            raise _unauthorized("Incorrect API key provided.")

    def _has_cookie(self, request: Request) -> bool:
        assert self._cookie is not None
        for part in request.headers.get("cookie", "").replace(",", ";").split(";"):
            name, _, value = part.strip().partition("=")
            if name == DASHBOARD_COOKIE and hmac.compare_digest(value.strip().encode("latin-1", "replace"),
                                                                self._cookie.encode()):
                return True
        return False

    def _set_cookie(self) -> tuple[str, str]:
        return ("set-cookie", f"{DASHBOARD_COOKIE}={self._cookie}; Path=/dashboard; HttpOnly; SameSite=Strict")


def _without_key(request: Request) -> str:
    """The request's path and query, the key left out (where the 303 sends the browser)."""
    rest = {name: value for name, value in request.query.items() if name != "key"}
    return f"{request.path}?{urlencode(rest)}" if rest else request.path


def _unauthorized(message: str) -> HttpError:
    return HttpError(401, message, code="invalid_api_key", headers=[("www-authenticate", "Bearer")])
