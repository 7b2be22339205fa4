"""Supervised asyncio tasks: a long-lived task that raises (or returns early) stops its process.

Every process keeps its loops (receive, schedule, work, heartbeats, monitors) in one `Supervisor`.
The first failure is logged once with its cause (`process_failed`), `stopped` is set so the
process shuts down through its normal path, and `exit_code` turns nonzero: nothing dies quietly
while the rest of the process keeps reporting ready.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any


class Supervisor:
    def __init__(self, log: Any, stopped: asyncio.Event) -> None:
        self.log = log
        self.stopped = stopped
        self.failure: str | None = None
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._closing = False
        self._on_failure: list[Callable[[str], None]] = []

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call `callback(cause)` on the first failure (e.g. to fail the requests in flight)."""
        self._on_failure.append(callback)

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` as long-lived task `name`; it must run until cancelled."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[task] = name
        task.add_done_callback(self._on_done)
        return task

    def fail(self, cause: str) -> None:
        """Record the first failure, log it and ask the process to stop."""
        if self.failure is None:
            self.failure = cause
            self.log.error("process_failed", cause=cause)
            for callback in self._on_failure:
                callback(cause)
        self.stopped.set()

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        name = self._tasks.pop(task, task.get_name())
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        self.fail(f"{name} failed: {exc!r}" if exc is not None else f"{name} exited unexpectedly")

    async def close(self) -> None:
        """Cancel every task and wait for them to finish unwinding."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def exit_code(self) -> int:
        return 0 if self.failure is None else 1


def stop_on_signals(stopped: asyncio.Event) -> None:
    """SIGTERM/SIGINT set `stopped`; call `ignore_signals` when shutdown starts so a second one cannot
    kill the process halfway through closing (the launcher escalates to SIGKILL if it hangs)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)


def ignore_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)
