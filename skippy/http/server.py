"""Minimal HTTP/1.1 server on asyncio streams + h11, used by the OpenAI-compatible adapter.

Routing by exact path, keep-alive, request bodies by Content-Length or chunked, size limits
(413 / 431), HTTP/1.0 and 1.1 only (505), OpenAI error envelopes for every error (a malformed or
truncated request gets a 400 before the connection closes), chunked streaming responses, and client
disconnect detection: while a handler runs or a stream is sent, a watcher reads the socket and, on
EOF, cancels the handler task (so its `finally:` blocks and the stream generator's run promptly).
This module is the connection loop; reading a request's head and framing a response are in
skippy.http.framing, what handlers see and the router in skippy.http.routing.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress
from typing import Any

import h11

from skippy.http.errors import HttpError
from skippy.http.framing import (
    body_too_large,
    check_head,
    close_stream,
    error_response,
    log_request,
    protocol_error,
    read_request,
    request_id_for,
    response_head,
)
from skippy.http.routing import Handler, Request, Response, Router, StreamResponse, json_response
from skippy.log import module_logger

__all__ = ["Handler", "HttpServer", "Request", "Response", "Router", "StreamResponse", "json_response"]

log = module_logger(component="http")

_READ_SIZE = 64 << 10
_LINGER_S = 2.0


class _Closed(Exception):
    """The connection ends without a response (idle timeout)."""


class _Connection:
    """One client connection: a loop of request -> handler -> response cycles over h11."""

    def __init__(self, server: HttpServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server, self.reader, self.writer = server, reader, writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=server.max_header_bytes)
        self.eof = False  # the peer closed its side
        self.linger = False  # drain the peer's input before closing, so an error response is not lost to a RST
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def run(self) -> None:
        try:
            while await self._cycle():
                self.conn.start_next_cycle()
        except _Closed as exc:
            log.info("http_connection_closed", peer=self.peer, reason=str(exc))
        except h11.RemoteProtocolError as exc:
            await self._reject_malformed(exc)
        except ConnectionError as exc:
            log.info("http_connection_closed", peer=self.peer, reason=type(exc).__name__)
        except Exception:
            log.exception("http_connection_error", peer=self.peer)
        finally:
            await self._close()

    async def _cycle(self) -> bool:
        """Serve one request; True when the connection stays open for the next one."""
        head = await self._next_event()
        if isinstance(head, h11.ConnectionClosed):
            return False
        assert isinstance(head, h11.Request)
        req = read_request(head)
        started = time.monotonic()
        try:
            check_head(head, max_header_bytes=self.server.max_header_bytes, max_body_bytes=self.server.max_body_bytes)
            req.body = await self._read_body()
        except (HttpError, h11.RemoteProtocolError) as exc:
            err = exc if isinstance(exc, HttpError) else protocol_error(exc)
            await self._send_response(req, error_response(err), started, close=True, error=err.message)
            self.linger = True
            return False
        return await self._guarded(req, started)

    async def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()  # RemoteProtocolError (truncated at EOF too): answered with a 400
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await asyncio.wait_for(self.reader.read(_READ_SIZE), self.server.idle_timeout_s)
            except TimeoutError:
                raise _Closed("idle_timeout") from None
            self.eof = not data
            self.conn.receive_data(data)

    async def _read_body(self) -> bytes:
        if self.conn.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        parts: list[bytes] = []
        size = 0
        while not isinstance(event := await self._next_event(), h11.EndOfMessage):
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.server.max_body_bytes:
                    raise body_too_large(self.server.max_body_bytes)
                parts.append(bytes(event.data))
        return b"".join(parts)

    async def _guarded(self, req: Request, started: float) -> bool:
        """Run the handler and its response while watching for the client going away; cancel on EOF."""
        work = asyncio.create_task(self._handle(req, started))
        watcher = asyncio.create_task(self._watch_eof())
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()
            work.cancel()
            log_request(req, 499, started, outcome="client_disconnected")
            return False
        finally:
            for task in (work, watcher):
                task.cancel()
            await asyncio.gather(work, watcher, return_exceptions=True)

    async def _watch_eof(self) -> None:
        """Return at EOF; pipelined bytes go to h11 for the next cycle (up to a bound, then stop reading)."""
        buffered = 0
        while buffered <= self.server.max_header_bytes:
            try:
                data = await self.reader.read(_READ_SIZE)
            except ConnectionError:
                data = b""
            if not data:
                self.eof = True
                return
            self.conn.receive_data(data)
            buffered += len(data)
        await asyncio.get_running_loop().create_future()  # back-pressure the peer; cancelled with the cycle

    async def _handle(self, req: Request, started: float) -> bool:
        try:
            result = await self.server.router.resolve(req.method, req.path)(req)
            if not isinstance(result, (Response, StreamResponse)):
                raise TypeError(f"handler returned {type(result).__name__}, not Response | StreamResponse")
        except HttpError as exc:
            return await self._send_response(req, error_response(exc), started, error=exc.message)
        except Exception:
            log.exception("http_handler_error", method=req.method, path=req.path, request_id=req.request_id)
            internal = HttpError(500, "internal error", type="server_error", code="internal_error")
            return await self._send_response(req, error_response(internal), started, error=internal.message)
        if isinstance(result, StreamResponse):
            return await self._stream(req, result, started)
        return await self._send_response(req, result, started)

    async def _send_response(self, req: Request, resp: Response, started: float, *, close: bool = False,
                             error: str | None = None) -> bool:
        headers = [*resp.headers, ("connection", "close")] if close else resp.headers
        body = b"" if req.method == "HEAD" else resp.body
        head = response_head(resp.status, req.request_id, headers, resp.content_type, len(resp.body))
        await self._send(head, h11.Data(data=body), h11.EndOfMessage())
        log_request(req, resp.status, started, **({"error": error} if error is not None else {}))
        return self.conn.our_state is h11.DONE

    async def _stream(self, req: Request, resp: StreamResponse, started: float) -> bool:
        chunks = aiter(resp.chunks)
        outcome = "complete"
        try:
            await self._send(response_head(resp.status, req.request_id, resp.headers, resp.content_type, None))
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except Exception:
                    log.exception("http_stream_error", method=req.method, path=req.path, request_id=req.request_id)
                    outcome = "stream_error"
                    break
                if chunk:
                    await self._send(h11.Data(data=chunk))
            await self._send(h11.EndOfMessage())
        except ConnectionError:
            outcome = "client_disconnected"
        finally:
            await close_stream(chunks, req)
        log_request(req, resp.status, started, outcome=outcome, streamed=True)
        return outcome == "complete" and self.conn.our_state is h11.DONE

    async def _reject_malformed(self, exc: h11.RemoteProtocolError) -> None:
        err = protocol_error(exc)
        req = Request("", "", {}, {}, b"", request_id_for(None))
        self.linger = True
        with suppress(h11.LocalProtocolError, ConnectionError):
            await self._send_response(req, error_response(err), time.monotonic(), close=True, error=err.message)

    async def _send(self, *events: Any) -> None:
        for event in events:
            data = self.conn.send(event)
            if data:
                self.writer.write(data)
        await self.writer.drain()

    async def _close(self) -> None:
        try:
            if self.linger and not self.eof and self.writer.can_write_eof():
                self.writer.write_eof()
                await asyncio.wait_for(self._discard_input(), _LINGER_S)
        except (OSError, TimeoutError):
            pass
        finally:
            self.writer.close()
            with suppress(OSError):
                await self.writer.wait_closed()

    async def _discard_input(self) -> None:
        while await self.reader.read(_READ_SIZE):
            pass


class HttpServer:
    """Accepts connections and serves each in its own task; `close` cancels them all and waits."""

    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0, *, max_body_bytes: int = 4 << 20,
                 max_header_bytes: int = 64 << 10, idle_timeout_s: float = 60.0) -> None:
        self.router, self.host, self.port = router, host, port
        self.max_body_bytes, self.max_header_bytes = max_body_bytes, max_header_bytes
        self.idle_timeout_s = idle_timeout_s
        self._server: asyncio.Server | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("http_listening", host=self.host, port=self.port)

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
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
            await _Connection(self, reader, writer).run()
        finally:
            self._tasks.discard(task)
