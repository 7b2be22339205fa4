"""Token events straight from stage 0 to the client that serves them, past the broker.

A client (the HTTP adapter under `skippy up`) binds a PULL and names it in `Submit.events_to`. Stage 0
then pushes that request's TokenEvents there itself, the final one included, and sends the submitter
(the broker) only a copy of the final event with `TokenEvents.sent_direct` set (how many tokens went
direct): the broker frees the request's permit and counts its tokens without relaying each token,
whose wake-ups and ZeroMQ I/O would compete with the stages for cores (measured in docs/bench-http.md).

Only `ipc://` endpoints are used: the client shares stage 0's host (the broker keeps `events_to` only
when it and stage 0 are both on ipc), and an ipc socket needs no CURVE keys. Sends never wait, and
nothing queues in stage 0 beyond ZeroMQ's high-water mark: toward each endpoint at most `max_queued`
events wait in its socket (SNDHWM; then the client's own receive queue and the kernel's buffers). An
event that finds them full is refused (`send` says False): the client does not read, or is gone, and
the request it belongs to is failed through its submitter (skippy.driver.requests). At most
`max_endpoints` sockets are open; one no request uses is closed to make room, and past that a new
endpoint is refused (`SinkRefused`: its requests' events go to the submitter instead).
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import msgspec
import zmq
import zmq.asyncio

from skippy.protocol import EventBatch, TokenEvents
from skippy.transport.queues import PushQueue

__all__ = ["MAX_ENDPOINTS", "MAX_QUEUED_EVENTS", "PATIENCE_S", "EventSinks", "SinkRefused", "submitter_copy", "usable"]

MAX_QUEUED_EVENTS = 1000  # events waiting in stage 0's socket toward one client at most (ZeroMQ's SNDHWM)
MAX_ENDPOINTS = 64  # client event endpoints with a socket open at once at most
PATIENCE_S = 5.0  # an event waits this long for room toward a client before its request is failed


class SinkRefused(Exception):
    """No socket toward an endpoint: ZeroMQ cannot connect there, or `max_endpoints` are in use."""


def usable(endpoint: str | None) -> bool:
    """Whether stage 0 pushes events to `endpoint` (an ipc endpoint on its own host)."""
    return endpoint is not None and endpoint.startswith("ipc://")


def submitter_copy(final: TokenEvents, tokens_sent: int) -> TokenEvents:
    """The final event as the submitter gets it when the client got every event directly."""
    return msgspec.structs.replace(final, tokens=(), logprobs=(), sent_direct=tokens_sent)


class EventSinks:
    """Stage 0's PUSH sockets toward clients' event endpoints, one per endpoint, on a context of their own
    (stage 0's may carry CURVE keys for its links; these stay on the host). A request `attach`es to its
    endpoint before its first event and `detach`es after its last."""

    def __init__(self, *, max_queued: int = MAX_QUEUED_EVENTS, max_endpoints: int = MAX_ENDPOINTS,
                 patience_s: float = PATIENCE_S) -> None:
        self.ctx = zmq.asyncio.Context()
        self.max_queued, self.patience_s = max_queued, patience_s
        self.max_endpoints = max_endpoints
        self._sinks: OrderedDict[str, PushQueue] = OrderedDict()  # least recently attached first
        self._users: Counter[str] = Counter()  # endpoint -> requests attached to it

    def attach(self, endpoint: str) -> None:
        """A request will push its events to `endpoint`: its socket, connected on first use (an unused one
        may be closed to make room). Raises SinkRefused when there is none to be had."""
        if endpoint not in self._sinks:
            if len(self._sinks) >= self.max_endpoints:
                idle = next((e for e in self._sinks if not self._users[e]), None)
                if idle is None:
                    raise SinkRefused(f"{self.max_endpoints} event endpoints in use")
                self._close(idle, linger_ms=500)
            try:
                self._sinks[endpoint] = PushQueue(self.ctx, endpoint, sndhwm=self.max_queued)
            except zmq.ZMQError as exc:
                raise SinkRefused(str(exc)) from exc
        self._sinks.move_to_end(endpoint)
        self._users[endpoint] += 1

    def detach(self, endpoint: str) -> None:
        """A request attached to `endpoint` has sent its last event (its socket stays open for the next)."""
        if self._users[endpoint] > 1:
            self._users[endpoint] -= 1
        else:
            del self._users[endpoint]

    async def send(self, endpoint: str, msg: TokenEvents | EventBatch) -> bool:
        """Put `msg` on the socket toward `endpoint` (attached); False, and nothing queued, when `max_queued`
        events wait there for `patience_s` (the client does not read, or is gone)."""
        return await self._sinks[endpoint].send_within(msg, self.patience_s)

    def _close(self, endpoint: str, linger_ms: int) -> None:
        self._sinks.pop(endpoint).close(linger_ms)
        self._users.pop(endpoint, None)

    def close(self, linger_ms: int = 500) -> None:
        """Close every socket (events still queued get `linger_ms` to leave) and the context."""
        for endpoint in list(self._sinks):
            self._close(endpoint, linger_ms)
        self.ctx.term()
