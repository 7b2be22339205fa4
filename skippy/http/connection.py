"""One client connection of skippy.http.server: a loop of request -> handler -> response cycles over h11.

A request head must arrive whole within `head_timeout_s` (from the accept, or on a kept-alive
connection from its first byte) and its body within `body_timeout_s` from the end of the head, as
deadlines over all their reads, so a client trickling a byte at a time is closed at the deadline (a
408 first when some of a request had arrived); a kept-alive connection idle for `idle_timeout_s` is
closed. Each closure is one `http_connection_closed` line with the peer and the reason, told to the
`ConnectionObserver`. While a handler runs or a stream is sent, a watcher reads the socket and, on
EOF, cancels the handler task (so its `finally:` blocks and the stream generator's run promptly).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress
from typing import Any, Protocol

import h11

from skippy.config.http_limits import HttpLimits
from skippy.http.busy import Busy
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
    request_timeout,
    response_head,
)
from skippy.http.routing import Request, Response, Router, StreamResponse
from skippy.log import module_logger

__all__ = ["Connection", "ConnectionObserver", "close_connection", "peer_name"]

log = module_logger(component="http")

_READ_SIZE = 64 << 10
_LINGER_S = 2.0


class ConnectionObserver(Protocol):
    """Told of connections refused (`max_connections`) and of clients closed as too slow (`head_timeout`,
    `body_timeout`, `idle_timeout`), and of the open count; the adapter's metrics are one."""

    def connection_refused(self, reason: str) -> None: ...

    def connection_timed_out(self, reason: str) -> None: ...

    def connections_open(self, count: int) -> None: ...


class _TimedOut(Exception):
    """A deadline passed: `reason` is head_timeout, body_timeout or idle_timeout."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Connection:
    """One client connection: a loop of request -> handler -> response cycles over h11."""

    def __init__(self, router: Router, limits: HttpLimits, observer: ConnectionObserver, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, busy: Busy | None = None) -> None:
        self.router, self.limits, self.observer, self.reader, self.writer = router, limits, observer, reader, writer
        self.busy = busy or Busy()  # the server's count of responses under way
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        self.eof = False  # the peer closed its side
        self.linger = False  # drain the peer's input before closing, so an error response is not lost to a RST
        self.peer = peer_name(writer)
        self.accepted = _now()
        self.served = 0  # requests read whole on this connection
        self.partial = False  # some of the current request has arrived
        self.current: Request | None = None  # the request whose body is being read

    async def run(self) -> None:
        try:
            while await self._cycle():
                self.conn.start_next_cycle()
        except _TimedOut as exc:
            await self._timed_out(exc.reason)
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
        self.partial, self.current = False, None
        head = await self._read_head()
        if isinstance(head, h11.ConnectionClosed):
            return False
        assert isinstance(head, h11.Request)
        req = self.current = read_request(head)
        started = time.monotonic()
        try:
            check_head(head, max_header_bytes=self.limits.max_header_bytes, max_body_bytes=self.limits.max_body_bytes)
            req.body = await self._read_body(_now() + self.limits.body_timeout_s)
        except (HttpError, h11.RemoteProtocolError) as exc:
            err = exc if isinstance(exc, HttpError) else protocol_error(exc)
            await self._send_response(req, error_response(err), started, close=True, error=err.message)
            self.linger = True
            return False
        self.served += 1
        self.current = None
        return await self._guarded(req, started)

    async def _read_head(self) -> Any:
        """The next request's head, or ConnectionClosed. A new connection has `head_timeout_s` from its accept
        for the whole head; a kept-alive one waits up to `idle_timeout_s` for the head's first byte, then
        has `head_timeout_s` from that byte."""
        head_since: float | None = self.accepted if self.served == 0 else None
        if head_since is None and self.conn.trailing_data[0]:  # pipelined: the head has begun
            head_since, self.partial = _now(), True
        idle_until = _now() + self.limits.idle_timeout_s
        while (event := self.conn.next_event()) is h11.NEED_DATA:  # RemoteProtocolError: answered with a 400
            if head_since is None:
                await self._receive(idle_until, "idle_timeout")
                head_since = _now()
            else:
                await self._receive(head_since + self.limits.head_timeout_s, "head_timeout")
            self.partial = self.partial or not self.eof
        return event

    async def _receive(self, deadline: float, reason: str) -> None:
        """Read what the peer sent into h11 (b"" at EOF), or raise _TimedOut(reason) at `deadline`."""
        try:
            data = await asyncio.wait_for(self.reader.read(_READ_SIZE), max(0.0, deadline - _now()))
        except TimeoutError:
            raise _TimedOut(reason) from None
        self.eof = not data
        self.conn.receive_data(data)

    async def _read_body(self, deadline: float) -> bytes:
        if self.conn.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        parts: list[bytes] = []
        size = 0
        while not isinstance(event := self.conn.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                await self._receive(deadline, "body_timeout")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limits.max_body_bytes:
                    raise body_too_large(self.limits.max_body_bytes)
                parts.append(bytes(event.data))
        return b"".join(parts)

    async def _timed_out(self, reason: str) -> None:
        """Close a connection whose deadline passed: one log line, counted; a 408 when a request had begun."""
        self.observer.connection_timed_out(reason)
        req = self.current
        where = {"method": req.method, "path": req.path, "request_id": req.request_id} if req is not None else {}
        if reason == "idle_timeout" or not self.partial:
            log.info("http_connection_closed", peer=self.peer, reason=reason, requests=self.served)
            return
        part = "body" if reason == "body_timeout" else "head"
        err = request_timeout(part, self.limits.body_timeout_s if part == "body" else self.limits.head_timeout_s)
        log.warning("http_connection_closed", peer=self.peer, reason=reason, status=err.status, **where)
        resp = error_response(err)
        head = response_head(err.status, req.request_id if req is not None else request_id_for(None),
                             [*resp.headers, ("connection", "close")], resp.content_type, len(resp.body))
        self.linger = True
        with suppress(h11.LocalProtocolError, ConnectionError, TimeoutError):  # a client that does not read
            await asyncio.wait_for(self._send(head, h11.Data(data=resp.body), h11.EndOfMessage()), _LINGER_S)

    async def _guarded(self, req: Request, started: float) -> bool:
        """Run the handler and its response while watching for the client going away; cancel on EOF."""
        work = asyncio.create_task(self._handle(req, started))
        watcher = asyncio.create_task(self._watch_eof())
        self.busy.enter()
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
            try:
                await asyncio.gather(work, watcher, return_exceptions=True)
            finally:
                self.busy.exit()

    async def _watch_eof(self) -> None:
        """Return at EOF; pipelined bytes go to h11 for the next cycle (up to a bound, then stop reading)."""
        buffered = 0
        while buffered <= self.limits.max_header_bytes:
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
            result = await self.router.resolve(req.method, req.path)(req)
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
        await close_connection(self.reader, self.writer, linger=self.linger and not self.eof)


def _now() -> float:
    return asyncio.get_running_loop().time()


def peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


async def close_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, linger: bool) -> None:
    """Close; with `linger`, first end our side and drain the peer's input (up to _LINGER_S), so a
    response just sent is not lost to a reset."""
    try:
        if linger and writer.can_write_eof():
            writer.write_eof()
            await asyncio.wait_for(_discard_input(reader), _LINGER_S)
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()


async def _discard_input(reader: asyncio.StreamReader) -> None:
    while await reader.read(_READ_SIZE):
        pass
