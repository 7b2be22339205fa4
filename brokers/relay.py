"""The broker's sends to its adapters: bounded, and never dropped in silence.

Nothing queues toward an adapter beyond `relay_hwm` messages (the ROUTER's SNDHWM, ROUTER_MANDATORY, sends
that never wait): an event the adapter's queue cannot take (it does not read) or that has no adapter to
go to (disconnected) is not dropped in silence. It is counted (`skippy_broker_relay_overflow_total`, by
reason full | gone), logged once per episode of that adapter (`relay_overflow`, then
`relay_overflow_ended` with the count), and its request fails: the broker cancels it at its pipeline and
finishes it with slow_client, whose final event is tried again every `FINAL_RETRY_EVERY_S` for `FINAL_RETRY_S`
while the adapter's queue is full (the client then gets the tokens it had and an error, never a hang).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import Counter

from skippy.protocol import Message, TokenEvents
from skippy.transport.overflow import Overflows
from skippy.transport.queues import Offer, RouterQueue

__all__ = ["FINAL_RETRY_EVERY_S", "FINAL_RETRY_S", "RELAY_HWM", "AdapterRelay"]

RELAY_HWM = 1000  # messages queued toward one adapter at most (ZeroMQ's default SNDHWM)
FINAL_RETRY_EVERY_S = 0.05  # a final event an adapter's full queue refused is tried again this often...
FINAL_RETRY_S = 30.0  # ...for this long (then dropped, logged `relay_final_dropped`)


class AdapterRelay:
    def __init__(self, router: Callable[[], RouterQueue | None], counter: Counter, log: Any,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]], closed: Callable[[], bool],
                 relay_hwm: int = RELAY_HWM) -> None:
        """`router`: the broker's ROUTER once started; `counter`: skippy_broker_relay_overflow_total (by reason);
        `spawn`: the broker's background tasks; `closed`: whether the broker is closing."""
        self.router, self.counter, self.log, self.spawn, self.closed = router, counter, log, spawn, closed
        self.relay_hwm = relay_hwm
        self.overflow = Overflows("relay_overflow", log)

    def tell(self, client: bytes, msg: Message, request_id: str | None = None) -> Offer:
        """Send `msg` to adapter `client` now, or count and log (once per episode) why it cannot take it."""
        router = self.router()
        assert router is not None
        offer = router.try_send(client, msg)
        if offer is Offer.SENT:
            self.overflow.ok(client, client=client.hex())
        else:
            self.counter.labels(str(offer)).inc()
            self.overflow.refused(client, client=client.hex(), reason=str(offer), request_id=request_id,
                                        relay_hwm=self.relay_hwm)
        return offer

    def tell_final(self, client: bytes, final: TokenEvents) -> None:
        """A request's final event to `client`: tried again for a while when its queue is full."""
        if self.router() is None:
            return
        if self.tell(client, final, final.request_id) is Offer.FULL and not self.closed():
            self.spawn(self._retry_final(client, final))

    async def _retry_final(self, client: bytes, final: TokenEvents) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + FINAL_RETRY_S
        while loop.time() < until:
            await asyncio.sleep(FINAL_RETRY_EVERY_S)  # ZeroMQ says no more than "full": ask again
            router = self.router()
            assert router is not None
            offer = router.try_send(client, final)
            if offer is Offer.SENT:
                self.overflow.ok(client, client=client.hex())
                return
            if offer is Offer.GONE:
                break
        self.log.warning("relay_final_dropped", client=client.hex(), request_id=final.request_id,
                         finish_reason=final.finish_reason, reason=str(offer))
