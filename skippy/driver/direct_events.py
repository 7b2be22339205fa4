"""Token events straight from stage 0 to the client that serves them, past the broker.

A client (the HTTP adapter under `skippy up`) binds a PULL and names it in `Submit.events_to`. Stage 0
then pushes that request's TokenEvents there itself, the final one included, and sends the submitter
(the broker) only a copy of the final event with `TokenEvents.sent_direct` set (how many tokens went
direct): the broker frees the request's permit and counts its tokens without relaying each token,
whose wake-ups and ZeroMQ I/O would compete with the stages for cores (measured in docs/bench-http.md).

Only `ipc://` endpoints are used: the client shares stage 0's host (the broker keeps `events_to` only
when it and stage 0 are both on ipc), and an ipc socket needs no CURVE keys. Sends never wait: a
client that is gone must not stall stage 0 (its events queue in ZeroMQ and are dropped on close).
"""

from __future__ import annotations

import msgspec
import zmq
import zmq.asyncio

from skippy.protocol import TokenEvents, encode
from skippy.transport.queues import PushQueue

__all__ = ["EventSinks", "submitter_copy", "usable"]


def usable(endpoint: str | None) -> bool:
    """Whether stage 0 pushes events to `endpoint` (an ipc endpoint on its own host)."""
    return endpoint is not None and endpoint.startswith("ipc://")


def submitter_copy(final: TokenEvents, tokens_sent: int) -> TokenEvents:
    """The final event as the submitter gets it when the client got every event directly."""
    return msgspec.structs.replace(final, tokens=(), logprobs=(), sent_direct=tokens_sent)


class EventSinks:
    """Stage 0's PUSH sockets toward clients' event endpoints, one per endpoint, on a context of their own
    (stage 0's may carry CURVE keys for its links; these stay on the host)."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self._sinks: dict[str, PushQueue] = {}

    def send(self, endpoint: str, msg: TokenEvents) -> None:
        """Hand `msg` to the socket toward `endpoint` (connected on first use); raises zmq.ZMQError if it
        cannot be connected."""
        sink = self._sinks.get(endpoint)
        if sink is None:
            sink = self._sinks[endpoint] = PushQueue(self.ctx, endpoint)
        waiting, _ = sink.send_frames_nowait(encode(msg))
        if waiting is not None:  # the client is slow or gone: the events wait in order; a failure is not news
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception())

    def close(self, linger_ms: int = 500) -> None:
        """Close every socket (events still queued get `linger_ms` to leave) and the context."""
        for sink in self._sinks.values():
            sink.close(linger_ms)
        self._sinks.clear()
        self.ctx.term()
