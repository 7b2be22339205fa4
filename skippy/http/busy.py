"""How many requests a server is in the middle of answering, and a bounded wait for none.

`HttpServer.close(grace_s)` waits on it so that responses under way (a stream whose request the adapter
has just failed, sending its error event and `[DONE]`) finish before their connections are closed.
"""

from __future__ import annotations

import asyncio


class Busy:
    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def exit(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is being answered; False when `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
