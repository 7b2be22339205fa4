"""CORS for the adapter's routes: preflight answers and `Access-Control-*` headers for allowed origins.

Allowed origins are configured (`skippy adapter --cors-origins`, which `skippy up` and stage 0's front
pass from `--openai-cors-origins`, both checked by skippy.config.serving.parse_cors_origins); none by
default, so a browser page on another origin cannot read responses unless the operator allows it. `*` allows any origin. Every
route answers `OPTIONS` (204 with `Allow`); the CORS headers are added only when the request's
`Origin` is allowed, to preflights (methods, the requested headers, max age) and to every response of
the route, errors included, so a browser client can read a 400 or 429.
"""

from __future__ import annotations

from collections.abc import Sequence

from skippy.http.errors import HttpError
from skippy.http.routing import Handler, Request, Response, StreamResponse

MAX_AGE_S = 600
ALLOWED_HEADERS = "authorization, content-type, x-request-id"
EXPOSED_HEADERS = "x-request-id, retry-after"


class CorsPolicy:
    def __init__(self, origins: Sequence[str] = ()) -> None:
        self.origins = tuple(origins)

    def allowed(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for this Origin, or None if it is not allowed."""
        if origin is None or not self.origins:
            return None
        if "*" in self.origins:
            return "*"
        return origin if origin.rstrip("/") in self.origins else None

    def headers(self, request: Request) -> list[tuple[str, str]]:
        allow = self.allowed(request.headers.get("origin"))
        if allow is None:
            return []
        return [("access-control-allow-origin", allow), ("vary", "origin"),
                ("access-control-expose-headers", EXPOSED_HEADERS)]

    def preflight(self, methods: Sequence[str]) -> Handler:
        """The OPTIONS handler of a route serving `methods`."""
        allow = ", ".join(sorted({*methods, "OPTIONS"}))

        async def answer(request: Request) -> Response:
            headers = [("allow", allow)]
            if self.allowed(request.headers.get("origin")) is not None:
                asked = request.headers.get("access-control-request-headers")
                headers += [*self.headers(request), ("access-control-allow-methods", allow),
                            ("access-control-allow-headers", asked or ALLOWED_HEADERS),
                            ("access-control-max-age", str(MAX_AGE_S))]
            return Response(204, b"", headers, content_type="")

        return answer

    def wrap(self, handler: Handler) -> Handler:
        """`handler` with the CORS headers on its responses and its HttpErrors."""

        async def with_cors(request: Request) -> Response | StreamResponse:
            extra = self.headers(request)
            try:
                response = await handler(request)
            except HttpError as exc:
                exc.headers += extra
                raise
            response.headers += extra
            return response

        return with_cors
