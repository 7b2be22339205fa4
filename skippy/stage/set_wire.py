"""Changing a running stage's wire condition from outside it: a SetWire to each stage's endpoint.

Used by `skippy wire` and by the benchmarks that change a link live (`python -m skippy.bench.netns dtype`);
the stage applies it with `skippy.stage.links.apply_wire` and logs `wire_changed`.
"""

from __future__ import annotations

from skippy.protocol import SetWire
from skippy.transport.curve_guard import LinkKeys, secured_context
from skippy.transport.queues import PushQueue


async def send_wire(endpoints: list[str], msg: SetWire, keys: LinkKeys | None = None) -> None:
    """Send `msg` to each endpoint (a stage's PULL) through a context secured with `keys` (None: plain)."""
    with secured_context(keys) as ctx:
        for endpoint in endpoints:
            queue = PushQueue(ctx, endpoint)
            await queue.send(msg)
            queue.close(linger_ms=2000)
