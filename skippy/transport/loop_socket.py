"""One ZeroMQ socket driven by the asyncio loop through its FD, without pyzmq's asyncio futures.

A receive is a non-blocking recv first; only when nothing is queued does it wait for the socket's FD.
A send goes onto the socket at once when there is room; otherwise it waits, in order behind every
send already waiting, until the FD says the socket changed. `try_send` never waits: no room, and it
says so (a sender toward a peer that may stop reading bounds its queue at the high-water mark).
Against pyzmq's asyncio sockets this saves, per message, a future, a turn of the loop and several
ZMQ_EVENTS queries, which add up on a decode step's critical path because each wake-up runs cold
after llama.cpp has swept the caches (measured: docs/measurements.md, 'LoopSocket').

ZeroMQ's FD signals a change of the socket's state and stays readable until the socket processes
its commands, and the loop polls it level-triggered. So every time it fires ZMQ_EVENTS is read
(which processes them: the loop would spin otherwise, and a send processes them only at most once
a millisecond) and says what to do: put waiting sends on the socket, wake a waiting receive. Any
send or receive processes commands too, and so may clear a signal meant for the other direction:
after one, with a wait pending in the other direction, the events are read by hand the same way.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import zmq

__all__ = ["LoopSocket"]

Parts = list[Any]  # frames as zmq takes them: bytes, memoryviews, zmq.Frame


class LoopSocket:
    """Owns `socket` (a plain, synchronous zmq socket used only from one event loop's thread). One task
    receives at a time (every queue has one receive loop); any number may send."""

    def __init__(self, socket: zmq.Socket[Any]) -> None:
        self.socket = socket
        self._loop: asyncio.AbstractEventLoop | None = None  # watching the FD from the first wait on
        self._reader: asyncio.Future[None] | None = None
        self._sends: deque[tuple[Parts, bool, asyncio.Future[None]]] = deque()

    async def recv_multipart(self) -> list[zmq.Frame]:
        waited = False
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:  # nothing queued (or a peer's connection torn down mid-message): wait
                frames = None
            if self._sends:
                self._on_fd()  # the recv processed the commands that would have told the FD of room
            if frames is not None:
                if not waited:  # a backlog must not starve the loop's other tasks (a busy stage's heartbeats)
                    await asyncio.sleep(0)
                return frames
            self._reader = self._watch().create_future()
            await self._reader
            waited = True

    def send_nowait(self, parts: Parts, copy: bool) -> asyncio.Future[None] | None:
        """None once the socket took `parts`; else a future done when it has (the socket was full)."""
        done = None
        if not self._sends:
            try:
                self.socket.send_multipart(parts, zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                done = self._wait_for_room(parts, copy)
        else:
            done = self._wait_for_room(parts, copy)
        if self._reader is not None:
            self._on_fd()  # the send may have processed the commands that would have told the FD of a message
        return done

    def try_send(self, parts: Parts, copy: bool) -> bool:
        """Put `parts` on the socket now, or refuse: False when it has no room (its high-water mark) or sends
        wait already; nothing is queued here. Other errors (EHOSTUNREACH of a ROUTER_MANDATORY socket) raise."""
        if self._sends:
            return False
        try:
            self.socket.send_multipart(parts, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return False
        finally:
            if self._reader is not None:
                self._on_fd()  # the send may have processed the commands that would have told the FD of a message
        return True

    def _wait_for_room(self, parts: Parts, copy: bool) -> asyncio.Future[None]:
        done = self._watch().create_future()
        self._sends.append((parts, copy, done))
        return done

    async def send(self, parts: Parts, copy: bool) -> None:
        waiting = self.send_nowait(parts, copy)
        if waiting is not None:
            await waiting

    def withdraw(self, waiting: asyncio.Future[None]) -> None:
        """Give up a send of `send_nowait` still waiting for room: it never reaches the socket."""
        waiting.cancel()
        self._sends = deque(send for send in self._sends if send[2] is not waiting)

    def _watch(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.socket.FD, self._on_fd)
        return self._loop

    def _on_fd(self) -> None:
        """The FD fired, or an operation in one direction may have eaten its signal for the other."""
        if self.socket.closed:
            return
        # first the events: reading them processes the socket's commands (a send only does so at most
        # once a millisecond), which clears the FD and may make room for waiting sends
        events = self._events()
        while events & zmq.POLLOUT and self._sends and self._flush():
            events = self._events()  # the sends processed commands too: look again
        if events & zmq.POLLIN:
            reader, self._reader = self._reader, None
            if reader is not None and not reader.done():
                reader.set_result(None)

    def _events(self) -> int:
        return int(self.socket.getsockopt(zmq.EVENTS))  # an int option

    def _flush(self) -> int:
        """Put waiting sends on the socket, in order, while it takes them; returns how many left the queue."""
        taken = 0
        while self._sends:
            parts, copy, done = self._sends[0]
            if not done.done():
                try:
                    self.socket.send_multipart(parts, zmq.NOBLOCK, copy=copy)
                except zmq.Again:
                    return taken
                except zmq.ZMQError as exc:
                    done.set_exception(exc)
                else:
                    done.set_result(None)
            self._sends.popleft()
            taken += 1
        return taken

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; sends still waiting for room are cancelled (their futures say so)."""
        if self._loop is not None and not self._loop.is_closed() and not self.socket.closed:
            self._loop.remove_reader(self.socket.FD)
        for _, _, done in self._sends:
            done.cancel()
        self._sends.clear()
        self.socket.close(linger=linger_ms)
