"""Minimal HTTP/1.1 server on asyncio streams + h11, used by the OpenAI-compatible adapter.

Routing by exact path, keep-alive, request bodies by Content-Length or chunked, size limits
(413 / 431), HTTP/1.0 and 1.1 only (505), OpenAI error envelopes for every error (a malformed or
truncated request gets a 400 before the connection closes), chunked streaming responses, and client
disconnect detection (the handler is cancelled when the client goes away).

Slow clients cannot hold it (skippy.config.http_limits.HttpLimits): deadlines for a request's whole
head and body and for an idle kept-alive connection (skippy.http.connection), and a cap on open
connections: past `max_connections` a new one gets a 503 with `Connection: close`, unread, one
`http_connection_refused` log line with the peer, told to the `ConnectionObserver` (the adapter's
/metrics counts refusals and slow clients closed). This module accepts connections; each is served by
skippy.http.connection; reading a request's head and framing a response are in skippy.http.framing,
what handlers see and the router in skippy.http.routing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from skippy.config.http_limits import HttpLimits
from skippy.http.busy import Busy
from skippy.http.connection import Connection, ConnectionObserver, close_connection, peer_name
from skippy.http.framing import refusal_bytes, too_many_connections
from skippy.http.routing import Handler, Request, Response, Router, StreamResponse, json_response
from skippy.log import module_logger

__all__ = ["ConnectionObserver", "Handler", "HttpLimits", "HttpServer", "Request", "Response", "Router",
           "StreamResponse", "json_response"]

log = module_logger(component="http")


class _Unobserved:
    def connection_refused(self, reason: str) -> None:
        pass

    def connection_timed_out(self, reason: str) -> None:
        pass

    def connections_open(self, count: int) -> None:
        pass


class HttpServer:
    """Accepts connections and serves each in its own task; `close` cancels them all and waits."""

    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0, *, limits: HttpLimits | None = None,
                 observer: ConnectionObserver | None = None) -> None:
        self.router, self.host, self.port = router, host, port
        self.limits = limits or HttpLimits()
        self.observer: ConnectionObserver = observer or _Unobserved()
        self._server: asyncio.Server | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._open = 0  # connections being served (refused ones not counted)
        self.busy = Busy()  # responses under way

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("http_listening", host=self.host, port=self.port)

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop accepting; give responses under way up to `grace_s` to finish; then close every connection."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        if grace_s > 0 and not await self.busy.wait_idle(grace_s):
            log.warning("http_close_grace_over", grace_s=grace_s, responses_under_way=self.busy.count)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        log.info("http_closed", host=self.host, port=self.port)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._closing:  # accepted just before close(): do not serve it
                writer.close()
                return
            if self._open >= self.limits.max_connections:
                await self._refuse(reader, writer)
                return
            self._open += 1
            self.observer.connections_open(self._open)
            try:
                await Connection(self.router, self.limits, self.observer, reader, writer, self.busy).run()
            finally:
                self._open -= 1
                self.observer.connections_open(self._open)
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # cancelled by close(): end normally, or asyncio's stream callback (3.11) logs a traceback for it
        finally:
            self._tasks.discard(task)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection too many: a 503 without reading the request, then close."""
        limit = self.limits.max_connections
        self.observer.connection_refused("max_connections")
        log.warning("http_connection_refused", peer=peer_name(writer), reason="max_connections", limit=limit)
        writer.write(refusal_bytes(too_many_connections(limit)))
        await close_connection(reader, writer, linger=True)
