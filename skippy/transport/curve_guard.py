"""CURVE on the sockets of a secured ZeroMQ context, and the ZAP handler that admits only known keys.

`secure(ctx, keys)` registers a context's `LinkKeys` and starts its `LinkGuard`: a thread answering
ZeroMQ's authentication requests (ZAP, `inproc://zeromq.zap.01` of that context). From then on
`configure_socket`, which every queue of skippy.transport calls before it binds or connects, makes a
bound socket a CURVE server (this process's key pair; peers admitted only when their public key is
one the topology names) and a connecting socket a CURVE client of the peer's key (the topology's key
for that endpoint; no key known is an error, never a plain fallback).

A client without CURVE, or one that does not know the server's key, fails the handshake: no frame of
it is ever delivered. Refused keys (`link_refused`, with the peer address and the key) and failed
handshakes (`link_handshake_failed`, from a monitor of each bound socket) are logged as warnings, at
most every `LOG_EVERY_S` per peer with the count since, because ZeroMQ peers retry. At most `max_noted`
peers are remembered for that (least recently heard first out, once quiet for `LOG_EVERY_S`): while that
many are heard from, a new stranger is not remembered but counted (`refused_unnoted`, on /metrics as
`skippy_link_refused_unnoted_total`: skippy.telemetry.links) and all of them logged together,
`link_refused_unnoted` at most every `LOG_EVERY_S` with the count since. The ZAP thread
answers every request (anything unexpected is refused), and bound sockets set ZAP_ENFORCE_DOMAIN, so
were the handler ever gone libzmq would refuse every client rather than admit any CURVE client.
Threads, not asyncio tasks, so that closing the context (ETERM) ends them cleanly.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from skippy.log import get_logger

__all__ = ["MAX_NOTED", "LinkGuard", "LinkKeyError", "LinkKeys", "configure_socket", "guard_of", "secure",
           "secured_context"]

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"skippy"
LOG_EVERY_S = 10.0
MAX_NOTED = 256  # peers (refused keys, failing endpoints) remembered to log at most every LOG_EVERY_S
_FAILED: dict[int, str] = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "no_detail", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
           zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth"}
_monitors = itertools.count()


class LinkKeyError(RuntimeError):
    """A secured process was asked to connect somewhere whose public key its topology does not name."""


@dataclass(frozen=True)
class LinkKeys:
    """One process's CURVE keys: its own pair, the servers it may dial, the clients it admits (Z85 bytes)."""

    name: str  # this process: a stage id or a client name
    public: bytes
    secret: bytes
    servers: Mapping[str, bytes]  # connect endpoint -> that server's public key
    allowed: Mapping[bytes, str]  # public key -> name, admitted by this process's bound sockets

    def server_key(self, endpoint: str) -> bytes:
        key = self.servers.get(endpoint)
        if key is None:
            raise LinkKeyError(f"{self.name}: no public key for {endpoint}; it is not an endpoint of the topology")
        return key


class LinkGuard:
    """The ZAP handler and bound-socket monitors of one secured context, with their counts."""

    def __init__(self, ctx: zmq.Context[Any], keys: LinkKeys, *, max_noted: int = MAX_NOTED) -> None:
        self.keys = keys
        self.max_noted = max_noted
        self.accepted = 0
        self.refused = 0
        self.refused_unnoted = 0  # refusals of peers not remembered: `max_noted` others were heard from lately
        self.failed_handshakes = 0
        self.log = get_logger(component="links")
        # the same libzmq context (so the same inproc namespace), for sockets used from threads
        self._sync: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)
        # peer -> (last logged, attempts since, last heard), least recently heard first
        self._noted: OrderedDict[str, tuple[float, int, float]] = OrderedDict()
        self._unnoted: tuple[float, int] = (-LOG_EVERY_S, 0)  # (last logged, attempts since) of all unnoted peers
        self._lock = threading.Lock()
        zap = self._sync.socket(zmq.ROUTER)
        zap.linger = 0
        zap.bind(ZAP_ENDPOINT)
        _thread("zap-handler", self._serve_zap, zap)
        self.log.info("links_secured", name=keys.name, public_key=keys.public.decode(), peers=len(keys.allowed))

    def _serve_zap(self, zap: zmq.Socket[bytes]) -> None:
        try:
            while True:
                try:
                    frames = zap.recv_multipart()
                    zap.send_multipart(self.answer(frames))
                except zmq.ContextTerminated:
                    return
                except zmq.ZMQError as exc:  # keep answering: a handler gone would mean no one admits anyone
                    self.log.error("zap_error", error=str(exc))
        finally:
            zap.close(linger=0)

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """The ZAP reply to one request: 200 with the peer's name for a known CURVE key, else 400."""
        if len(frames) < 8:
            self.refused += 1
            return [*frames[:1], b"", b"1.0", frames[3] if len(frames) > 3 else b"", b"400", b"malformed", b"", b""]
        routing, _, _version, request_id, _domain, address, _identity, mechanism, *credentials = frames
        try:
            key = z85.encode(credentials[0]) if mechanism == b"CURVE" and len(credentials) == 1 else None
            name = self.keys.allowed.get(key) if key is not None else None
        except Exception:  # noqa: BLE001 - anything unexpected is a refusal, and the handler keeps answering
            key, name = None, None
        if name is None:
            self.refused += 1
            self._note(f"refused {address!r} {key!r}", "link_refused", peer=address.decode(errors="replace"),
                       mechanism=mechanism.decode(errors="replace"), public_key=key.decode() if key else None)
            return [routing, b"", b"1.0", request_id, b"400", b"unknown key", b"", b""]
        self.accepted += 1
        return [routing, b"", b"1.0", request_id, b"200", b"OK", name.encode(), b""]

    def watch(self, socket: zmq.Socket[Any], endpoint: str) -> None:
        """Log failed handshakes on bound `socket` (its monitor, read by a thread until the socket closes)."""
        address = f"inproc://skippy-link-monitor-{id(self)}-{next(_monitors)}"
        socket.monitor(address, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                       | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        pair = self._sync.socket(zmq.PAIR)
        pair.linger = 0
        pair.connect(address)
        _thread("link-monitor", self._read_monitor, pair, endpoint)

    def _read_monitor(self, pair: zmq.Socket[bytes], endpoint: str) -> None:
        try:
            while (event := recv_monitor_message(pair))["event"] != zmq.EVENT_MONITOR_STOPPED:
                why = _FAILED.get(int(event["event"]))
                if why is None:
                    continue
                self.failed_handshakes += 1
                if why != "auth":  # a refused key is logged by the ZAP handler, with the key
                    self._note(f"failed {endpoint} {why}", "link_handshake_failed", endpoint=endpoint, reason=why,
                               error=zmq.strerror(event["value"]) if why == "protocol" else None)
        except zmq.ContextTerminated:
            pass
        finally:
            pair.close(linger=0)

    def _note(self, what: str, event: str, **fields: Any) -> None:
        """Log `event` for peer `what` now if it was not logged within LOG_EVERY_S, with the count since; a
        peer that finds `max_noted` others heard from within LOG_EVERY_S is counted among the unnoted."""
        now = time.monotonic()
        with self._lock:
            noted = self._noted
            if what not in noted and len(noted) >= self.max_noted:
                oldest = next(iter(noted.values()))
                if now - oldest[2] < LOG_EVERY_S:  # all heard lately (a flood of strangers): remember none more
                    self.refused_unnoted += 1
                    last, count = self._unnoted
                    due = now - last >= LOG_EVERY_S
                    self._unnoted = (now, 0) if due else (last, count + 1)
                    if due:
                        self.log.warning("link_refused_unnoted", attempts=count + 1, remembered=len(noted), **fields)
                    return
                noted.popitem(last=False)  # quiet for LOG_EVERY_S: forgotten (logged afresh if it comes back)
            last, count, _ = noted.pop(what, (-LOG_EVERY_S, 0, now))
            due = now - last >= LOG_EVERY_S
            noted[what] = (now, 0, now) if due else (last, count + 1, now)
        if due:
            self.log.warning(event, attempts=count + 1, **fields)


def _thread(name: str, target: Any, *args: Any) -> None:
    """A daemon thread running `target` with the caller's log context (the process's bound ids)."""
    threading.Thread(target=contextvars.copy_context().run, args=(target, *args), name=name, daemon=True).start()


_GUARDS: weakref.WeakKeyDictionary[zmq.Context[Any], LinkGuard] = weakref.WeakKeyDictionary()


def secure(ctx: zmq.Context[Any], keys: LinkKeys, *, max_noted: int = MAX_NOTED) -> LinkGuard:
    """Put CURVE with `keys` on every socket `ctx` opens from now on (before the first bind or connect)."""
    if ctx in _GUARDS:
        raise RuntimeError(f"context already secured for {_GUARDS[ctx].keys.name}")
    guard = _GUARDS[ctx] = LinkGuard(ctx, keys, max_noted=max_noted)
    return guard


@contextlib.contextmanager
def secured_context(keys: LinkKeys | None) -> Iterator[zmq.asyncio.Context]:
    """A fresh asyncio context, secured with `keys` when there are any; terminated on exit (close its sockets)."""
    ctx = zmq.asyncio.Context()
    try:
        if keys is not None:
            secure(ctx, keys)
        yield ctx
    finally:
        ctx.term()


def guard_of(ctx: zmq.Context[Any]) -> LinkGuard | None:
    return _GUARDS.get(ctx)


def configure_socket(ctx: zmq.Context[Any], socket: zmq.Socket[Any], endpoint: str, *, server: bool) -> None:
    """CURVE options for a socket of `ctx` about to bind (`server`) or connect to `endpoint`; nothing when
    `ctx` is not secured."""
    guard = _GUARDS.get(ctx)
    if guard is None:
        return
    keys = guard.keys
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    if server:
        socket.curve_server = True
        socket.zap_domain = ZAP_DOMAIN
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler answering: refuse, never admit anyone
        guard.watch(socket, endpoint)
    else:
        socket.curve_serverkey = keys.server_key(endpoint)
