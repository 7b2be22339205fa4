"""ZeroMQ, wrapped once: typed asyncio PULL/PUSH queues of protocol messages.

Each queue owns one socket and closes it explicitly.  :class:`PullQueue` binds
and hands back decoded messages, or the :class:`ProtocolError` of a bad one so
the caller can log and answer it and keep serving.  :class:`PushQueue` connects
and sends large activation frames zero-copy: the array behind a sent
``Batch.hidden`` must not be mutated until ZeroMQ has put it on the wire.
Every socket is opened by `_open`, which asks skippy.curve.guard for CURVE
first: on a context given link keys (`skippy.curve.guard.secure`) every bind is a
CURVE server admitting the topology's keys and every connect a CURVE client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import zmq
import zmq.asyncio

from skippy.curve.guard import configure_socket
from skippy.protocol import Message, ProtocolError, decode, encode

__all__ = ["ZERO_COPY_MIN_BYTES", "DealerQueue", "PullQueue", "PushQueue", "RouterQueue", "ipc_endpoint", "request_endpoint"]

ZERO_COPY_MIN_BYTES = 64 * 1024  # below this, copying is cheaper than ZeroMQ's zero-copy bookkeeping
_IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux

Decoder = Callable[[list[zmq.Frame]], Message]
Encoder = Callable[[Message], Sequence[bytes | memoryview]]


def ipc_endpoint(directory: Path, name: str) -> str:
    """``ipc://`` endpoint for socket file ``name`` in ``directory`` (which must exist to bind)."""
    if not name or "/" in name:
        raise ValueError(f"ipc socket name must be a plain file name, got {name!r}")
    path = str(Path(directory).absolute() / name)
    if len(path.encode()) > _IPC_PATH_MAX:
        raise ValueError(f"ipc socket path is {len(path.encode())} bytes, over the {_IPC_PATH_MAX}-byte limit: {path}")
    return f"ipc://{path}"


def request_endpoint(pipeline_endpoint: str) -> str:
    if pipeline_endpoint.startswith("ipc://"):
        return pipeline_endpoint + ".req"
    if pipeline_endpoint.startswith("tcp://"):
        host, _, port = pipeline_endpoint[len("tcp://") :].rpartition(":")
        return f"tcp://{host}:{int(port) + 1}"
    raise ValueError(f"cannot derive a request endpoint from {pipeline_endpoint!r} (use ipc:// or tcp://)")


def _open(ctx: zmq.asyncio.Context, kind: int, endpoint: str, *, bind: bool, options: dict[int, int] | None = None,
          socket_class: type[zmq.Socket[Any]] = zmq.asyncio.Socket) -> tuple[Any, str]:
    """A socket of `kind` with `options`, CURVE when `ctx` is secured, bound to (or connected to) `endpoint`;
    returns it and the endpoint (bound: tcp port 0 resolved)."""
    socket: Any = ctx.socket(kind, socket_class=socket_class)  # type: ignore[arg-type]  # pyzmq types the class narrowly
    try:
        for option, value in (options or {}).items():
            socket.setsockopt(option, value)
        configure_socket(ctx, socket, endpoint, server=bind)
        if bind:
            socket.bind(endpoint)
            return socket, socket.getsockopt_string(zmq.LAST_ENDPOINT)
        socket.connect(endpoint)
        return socket, endpoint
    except BaseException:
        socket.close(linger=0)
        raise


class PullQueue:
    """Binds a PULL socket at ``endpoint``; ``self.endpoint`` is the bound address (tcp port 0 resolved).

    Receives without pyzmq's futures: a non-blocking recv first, and only when nothing is queued a wait
    on the socket's FD (watched by the event loop from the first wait on). Per message that saves a
    future, a loop turn and several ZMQ_EVENTS queries on a decode step's critical path."""

    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, *, decoder: Decoder = decode, rcvhwm: int = 1000
    ) -> None:
        self._decoder = decoder
        self._socket, self.endpoint = _open(ctx, zmq.PULL, endpoint, bind=True, options={zmq.RCVHWM: rcvhwm},
                                            socket_class=zmq.Socket)
        self._loop: asyncio.AbstractEventLoop | None = None  # watching the FD
        self._waiter: asyncio.Future[None] | None = None

    async def recv(self) -> Message | ProtocolError:
        """The next message, or the ProtocolError describing why it was rejected."""
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                await self._readable()
                continue
            return _decoded(self._decoder, frames)

    def _readable(self) -> asyncio.Future[None]:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._socket.FD, self._on_fd)
        self._waiter = self._loop.create_future()
        return self._waiter

    def _on_fd(self) -> None:
        """The FD says the socket's state changed (the loop polls it level-triggered): wake the waiting
        recv, or with none waiting read ZMQ_EVENTS, which clears the FD (else the loop would spin on it)."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        elif not self._socket.closed:
            self._socket.getsockopt(zmq.EVENTS)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed() and not self._socket.closed:
            self._loop.remove_reader(self._socket.FD)
        self._socket.close(linger=0)


class PushQueue:
    """Connects a PUSH socket to ``endpoint``; sends block (asynchronously) at ``sndhwm`` queued messages."""

    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, *, encoder: Encoder = encode, sndhwm: int = 1000
    ) -> None:
        self._encoder = encoder
        self._socket, self.endpoint = _open(ctx, zmq.PUSH, endpoint, bind=False, options={zmq.SNDHWM: sndhwm})
        # a synchronous view of the same socket: a send the socket takes at once skips pyzmq's future
        self._now: zmq.Socket[bytes] = zmq.Socket.shadow(self._socket.underlying)
        self._waiting = 0  # sends waiting in pyzmq for room: later sends queue behind them, in order

    async def send(self, msg: Message) -> int:
        """Send ``msg``; returns the bytes handed to ZeroMQ (all frames)."""
        return await self.send_frames(self._encoder(msg))

    async def send_frames(self, frames: Sequence[bytes | memoryview]) -> int:
        """Send frames already encoded (by `protocol.encode`)."""
        waiting, nbytes = self.send_frames_nowait(frames)
        if waiting is not None:
            await waiting
        return nbytes

    def send_frames_nowait(self, frames: Sequence[bytes | memoryview]) -> tuple[asyncio.Future[Any] | None, int]:
        """Hand frames to ZeroMQ now: (None if the socket took them, else pyzmq's future, done once they are
        on the socket (the socket was full: they wait, in order); the bytes handed over)."""
        parts, copy, nbytes = _multipart(frames)
        if not self._waiting:
            try:
                self._now.send_multipart(parts, zmq.NOBLOCK, copy=copy)
                return None, nbytes
            except zmq.Again:
                pass
        self._waiting += 1
        waiting = cast("asyncio.Future[Any]", self._socket.send_multipart(parts, copy=copy))
        waiting.add_done_callback(self._landed)
        return waiting, nbytes

    def _landed(self, _: asyncio.Future[Any]) -> None:
        self._waiting -= 1

    def close(self, linger_ms: int = 0) -> None:
        """Close; queued messages get ``linger_ms`` to leave (0 drops them, -1 waits forever)."""
        self._socket.close(linger=linger_ms)


def _multipart(frames: Sequence[bytes | memoryview]) -> tuple[list[bytes | memoryview], bool, int]:
    """(frames, copy?, bytes): a large activation frame goes zero-copy."""
    sizes = [memoryview(f).nbytes for f in frames]
    zero_copy = len(sizes) > 1 and sizes[1] > ZERO_COPY_MIN_BYTES
    return list(frames), not zero_copy, sum(sizes)


async def _send_frames(socket: zmq.asyncio.Socket, frames: Sequence[bytes | memoryview], prefix: bytes = b"") -> int:
    parts, copy, nbytes = _multipart(frames)
    await socket.send_multipart([prefix, *parts] if prefix else parts, copy=copy)
    return nbytes


async def _recv(socket: zmq.asyncio.Socket) -> list[zmq.Frame]:
    """The next multipart message. libzmq may say a socket is readable and then have nothing (a peer's
    connection torn down mid-message, e.g. a stage restarting): pyzmq raises Again; wait again."""
    while True:
        try:
            return await socket.recv_multipart(copy=False)
        except zmq.Again:
            continue


def _decoded(decoder: Decoder, frames: list[zmq.Frame]) -> Message | ProtocolError:
    try:
        return decoder(frames)
    except ProtocolError as exc:
        return exc


class RouterQueue:
    """Binds a ROUTER for request/reply clients (stage 0's request endpoint); messages carry the client id."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, decoder: Decoder = decode) -> None:
        self._decoder = decoder
        # a reply to a vanished client is dropped (not ROUTER_MANDATORY)
        self._socket, self.endpoint = _open(ctx, zmq.ROUTER, endpoint, bind=True, options={zmq.ROUTER_MANDATORY: 0})

    async def recv(self) -> tuple[bytes, Message | ProtocolError]:
        client, *frames = await _recv(self._socket)
        return client.bytes, _decoded(self._decoder, frames)

    async def send(self, client: bytes, msg: Message) -> int:
        return await _send_frames(self._socket, encode(msg), prefix=client)

    def close(self, linger_ms: int = 0) -> None:
        """Close; replies still queued get ``linger_ms`` to leave."""
        self._socket.close(linger=linger_ms)


class DealerQueue:
    """Connects a DEALER to a RouterQueue: send requests, receive replies (any order)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, decoder: Decoder = decode) -> None:
        self._decoder = decoder
        self._socket, self.endpoint = _open(ctx, zmq.DEALER, endpoint, bind=False)

    async def send(self, msg: Message) -> int:
        return await _send_frames(self._socket, encode(msg))

    async def recv(self) -> Message | ProtocolError:
        return _decoded(self._decoder, await _recv(self._socket))

    def close(self, linger_ms: int = 0) -> None:
        self._socket.close(linger=linger_ms)
