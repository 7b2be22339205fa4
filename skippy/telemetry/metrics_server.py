"""A process's own Prometheus /metrics server: a small threaded HTTP server, behind the API key when set.

prometheus_client's `start_http_server` has no authentication, so stages, the driver and the broker
serve /metrics with this instead: `GET /metrics` (any query) answers the registry's text in the
format the scraper asks for (`choose_encoder`: Prometheus text or OpenMetrics); with a key it wants
`Authorization: Bearer KEY` (compared in constant time) and answers 401 with `WWW-Authenticate:
Bearer` otherwise. Any other path or method is a 404 / 405. It listens on loopback unless the process
is told `--metrics-bind HOST`; requests are served on daemon threads and never logged.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import choose_encoder

from skippy.config.api_key import bearer_matches, bearer_token

__all__ = ["MetricsServer"]


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # the http.server method names
        if self.path.partition("?")[0] != "/metrics":
            self._answer(404, b"not found\n", "text/plain; charset=utf-8")
            return
        key = self.server.api_key
        if key is not None and not bearer_matches(bearer_token(self.headers.get("authorization", "")), key):
            self._answer(401, b"unauthorized: send the API key as Authorization: Bearer KEY\n",
                         "text/plain; charset=utf-8", [("WWW-Authenticate", "Bearer")])
            return
        encoder, content_type = choose_encoder(self.headers.get("accept", ""))
        self._answer(200, encoder(self.server.registry), content_type)

    def do_POST(self) -> None:
        self._answer(405, b"method not allowed\n", "text/plain; charset=utf-8", [("Allow", "GET")])

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _answer(self, status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers or []:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        pass  # no access log: the process's own JSON lines are its log


class MetricsServer(ThreadingHTTPServer):
    """/metrics of `registry` (anything with `collect()`) on `host` at an ephemeral port, `api_key` or open."""

    daemon_threads = True

    def __init__(self, registry: Any, host: str = "127.0.0.1", api_key: str | None = None) -> None:
        self.registry = registry
        self.api_key = api_key
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, 0), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, name="metrics-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
