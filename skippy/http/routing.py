"""What handlers see and return: Request, Response, StreamResponse, and the Router that maps
(method, path) to a handler with OpenAI-envelope 404/405 errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from skippy.http.errors import HttpError
from skippy.http.json_body import JsonBodyError, loads


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    request_id: str

    def json(self) -> Any:
        """The body as JSON, bounded (skippy.http.json_body); anything else is a 400 `invalid_json`."""
        try:
            return loads(self.body)
        except JsonBodyError as exc:
            raise HttpError(400, f"invalid JSON body: {exc}", code="invalid_json") from None


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "application/json"


@dataclass
class StreamResponse:
    chunks: AsyncIterator[bytes]
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "text/event-stream"


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


def json_response(obj: Any, status: int = 200, headers: Sequence[tuple[str, str]] = ()) -> Response:
    return Response(status, json.dumps(obj).encode(), list(headers))


class Router:
    """Exact-path routing: 404 for an unknown path, 405 (with Allow) for a known path and another method. A
    path ending in `/{name}` (`/v1/models/{id}`) takes every longer path under it that no exact route takes;
    its handler reads the rest from `request.path`."""

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._routes.setdefault(path, {})[method.upper()] = handler

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, path) served, in the order added."""
        return [(method, path) for path, methods in self._routes.items() for method in methods]

    def _under(self, path: str) -> dict[str, Handler] | None:
        """The methods of the longest `/{name}` route `path` lies under."""
        prefixes = [p for p in self._routes if p.endswith("}") and "/{" in p]
        for pattern in sorted(prefixes, key=len, reverse=True):
            prefix = pattern[:pattern.rindex("/{") + 1]
            if path.startswith(prefix) and len(path) > len(prefix):
                return self._routes[pattern]
        return None

    def resolve(self, method: str, path: str) -> Handler:
        methods = self._routes.get(path) or self._under(path)
        if methods is None:
            raise HttpError(404, f"Invalid URL ({method} {path})", code="not_found")
        handler = methods.get(method.upper())
        if handler is None:
            allow = [("allow", ", ".join(sorted(methods)))]
            raise HttpError(405, f"Method {method} not allowed for {path}", code="method_not_allowed", headers=allow)
        return handler
