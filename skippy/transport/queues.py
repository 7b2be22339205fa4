"""ZeroMQ, wrapped once: typed asyncio PULL/PUSH (and ROUTER/DEALER) queues of protocol messages.

Each queue owns one socket (a `LoopSocket`: driven by the event loop through its FD) and closes it
explicitly.  :class:`PullQueue` binds
and hands back decoded messages, or the :class:`ProtocolError` of a bad one so
the caller can log and answer it and keep serving.  :class:`PushQueue` connects
and sends large activation frames zero-copy: the array behind a sent
``Batch.hidden`` must not be mutated until ZeroMQ has put it on the wire.
Every socket is opened by `_open`, which asks `curve_guard` for CURVE
first: on a context given link keys (`curve_guard.secure`) every bind is a
CURVE server admitting the topology's keys and every connect a CURVE client.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from skippy.protocol import Message, ProtocolError, decode, encode
from skippy.transport.curve_guard import configure_socket
from skippy.transport.loop_socket import LoopSocket

__all__ = ["ZERO_COPY_MIN_BYTES", "DealerQueue", "Offer", "PullQueue", "PushQueue", "RouterQueue"]

ZERO_COPY_MIN_BYTES = 64 * 1024  # below this, copying is cheaper than ZeroMQ's zero-copy bookkeeping

Decoder = Callable[[list[zmq.Frame]], Message]
Encoder = Callable[[Message], Sequence[bytes | memoryview]]


class Offer(enum.StrEnum):
    """What became of a message offered with `try_send` (which never waits)."""

    SENT = "sent"  # on the socket (on its way)
    FULL = "full"  # refused: the peer's queue is at the high-water mark (it does not read)
    GONE = "gone"  # refused: no such peer is connected (a ROUTER with `mandatory`)


def _open(ctx: zmq.asyncio.Context, kind: int, endpoint: str, *, bind: bool,
          options: dict[int, int] | None = None) -> tuple[LoopSocket, str]:
    """A socket of `kind` with `options`, CURVE when `ctx` is secured, bound to (or connected to) `endpoint`;
    returns it and the endpoint (bound: tcp port 0 resolved)."""
    socket: zmq.Socket[bytes] = ctx.socket(kind, socket_class=zmq.Socket)  # type: ignore[arg-type,assignment]
    try:
        for option, value in (options or {}).items():
            socket.setsockopt(option, value)
        configure_socket(ctx, socket, endpoint, server=bind)
        if bind:
            socket.bind(endpoint)
            return LoopSocket(socket), socket.getsockopt_string(zmq.LAST_ENDPOINT)
        socket.connect(endpoint)
        return LoopSocket(socket), endpoint
    except BaseException:
        socket.close(linger=0)
        raise


class PullQueue:
    """Binds a PULL socket at ``endpoint``; ``self.endpoint`` is the bound address (tcp port 0 resolved)."""

    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, *, decoder: Decoder = decode, rcvhwm: int = 1000
    ) -> None:
        self._decoder = decoder
        self._socket, self.endpoint = _open(ctx, zmq.PULL, endpoint, bind=True, options={zmq.RCVHWM: rcvhwm})

    async def recv(self) -> Message | ProtocolError:
        """The next message, or the ProtocolError describing why it was rejected."""
        return _decoded(self._decoder, await self._socket.recv_multipart())

    def close(self) -> None:
        self._socket.close(linger_ms=0)


class PushQueue:
    """Connects a PUSH socket to ``endpoint``; sends block (asynchronously) at ``sndhwm`` queued messages."""

    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, *, encoder: Encoder = encode, sndhwm: int = 1000
    ) -> None:
        self._encoder = encoder
        self._socket, self.endpoint = _open(ctx, zmq.PUSH, endpoint, bind=False, options={zmq.SNDHWM: sndhwm})

    async def send(self, msg: Message) -> int:
        """Send ``msg``; returns the bytes handed to ZeroMQ (all frames)."""
        return await self.send_frames(self._encoder(msg))

    async def send_frames(self, frames: Sequence[bytes | memoryview]) -> int:
        """Send frames already encoded (by `protocol.encode`)."""
        return await _send_frames(self._socket, frames)

    async def send_within(self, msg: Message, timeout_s: float) -> bool:
        """Send ``msg``, waiting at most ``timeout_s`` for room behind ``sndhwm`` queued messages; False, and
        nothing queued, when none came (a waiting send keeps its place in order while it waits)."""
        parts, copy, _ = _multipart(self._encoder(msg))
        waiting = self._socket.send_nowait(parts, copy)
        if waiting is None:
            return True
        await asyncio.wait({waiting}, timeout=timeout_s)
        if not waiting.done():
            self._socket.withdraw(waiting)
            return False
        return not waiting.cancelled() and waiting.exception() is None

    def send_frames_nowait(self, frames: Sequence[bytes | memoryview]) -> tuple[asyncio.Future[None] | None, int]:
        """Hand frames to ZeroMQ now: (None if the socket took them, else a future done once they are on it
        (the socket was full: they wait, in order); the bytes handed over)."""
        parts, copy, nbytes = _multipart(frames)
        return self._socket.send_nowait(parts, copy), nbytes

    def close(self, linger_ms: int = 0) -> None:
        """Close; queued messages get ``linger_ms`` to leave (0 drops them, -1 waits forever)."""
        self._socket.close(linger_ms)


def _multipart(frames: Sequence[bytes | memoryview]) -> tuple[list[bytes | memoryview], bool, int]:
    """(frames, copy?, bytes): a large activation frame goes zero-copy."""
    sizes = [memoryview(f).nbytes for f in frames]
    zero_copy = len(sizes) > 1 and sizes[1] > ZERO_COPY_MIN_BYTES
    return list(frames), not zero_copy, sum(sizes)


async def _send_frames(socket: LoopSocket, frames: Sequence[bytes | memoryview], prefix: bytes = b"") -> int:
    parts, copy, nbytes = _multipart(frames)
    await socket.send([prefix, *parts] if prefix else parts, copy)
    return nbytes


def _decoded(decoder: Decoder, frames: list[zmq.Frame]) -> Message | ProtocolError:
    try:
        return decoder(frames)
    except ProtocolError as exc:
        return exc


class RouterQueue:
    """Binds a ROUTER for request/reply clients (stage 0's request endpoint); messages carry the client id.

    By default a reply to a vanished client, or past a client's ``sndhwm`` queued replies, is dropped by
    ZeroMQ without a word. With ``mandatory`` (ROUTER_MANDATORY) send with `try_send`, which says so."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, decoder: Decoder = decode, sndhwm: int = 1000,
                 mandatory: bool = False) -> None:
        self._decoder = decoder
        self._socket, self.endpoint = _open(ctx, zmq.ROUTER, endpoint, bind=True,
                                            options={zmq.ROUTER_MANDATORY: int(mandatory), zmq.SNDHWM: sndhwm})

    async def recv(self) -> tuple[bytes, Message | ProtocolError]:
        client, *frames = await self._socket.recv_multipart()
        return client.bytes, _decoded(self._decoder, frames)

    async def send(self, client: bytes, msg: Message) -> int:
        return await _send_frames(self._socket, encode(msg), prefix=client)

    def try_send(self, client: bytes, msg: Message) -> Offer:
        """Put ``msg`` for ``client`` on the socket now, or say why not (never waits, never queues here)."""
        parts, copy, _ = _multipart(encode(msg))
        try:
            return Offer.SENT if self._socket.try_send([client, *parts], copy) else Offer.FULL
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return Offer.GONE
            raise

    def close(self, linger_ms: int = 0) -> None:
        """Close; replies still queued get ``linger_ms`` to leave."""
        self._socket.close(linger_ms)


class DealerQueue:
    """Connects a DEALER to a RouterQueue: send requests, receive replies (any order)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, decoder: Decoder = decode) -> None:
        self._decoder = decoder
        self._socket, self.endpoint = _open(ctx, zmq.DEALER, endpoint, bind=False)
        self._ctx = ctx
        self._monitor: LoopSocket | None = None  # a PAIR reporting disconnects, made by `disconnected`

    async def send(self, msg: Message) -> int:
        return await _send_frames(self._socket, encode(msg))

    async def recv(self) -> Message | ProtocolError:
        return _decoded(self._decoder, await self._socket.recv_multipart())

    async def disconnected(self) -> None:
        """Return when the connection to the peer is lost (the peer exited or its socket closed); ZeroMQ
        keeps reconnecting by itself, so call it again to watch for the next loss."""
        if self._monitor is None:
            address = f"inproc://dealer-monitor-{id(self)}-{self._socket.socket.FD}"
            self._socket.socket.monitor(address, zmq.EVENT_DISCONNECTED)
            pair: zmq.Socket[bytes] = self._ctx.socket(zmq.PAIR, socket_class=zmq.Socket)  # type: ignore[arg-type,assignment]
            pair.connect(address)
            self._monitor = LoopSocket(pair)
        while True:
            frames = await self._monitor.recv_multipart()
            if parse_monitor_message([f.bytes for f in frames])["event"] == zmq.EVENT_DISCONNECTED:
                return

    def close(self, linger_ms: int = 0) -> None:
        if self._monitor is not None:
            self._socket.socket.disable_monitor()
            self._monitor.close(0)
        self._socket.close(linger_ms)
