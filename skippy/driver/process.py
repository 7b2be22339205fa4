"""Stage 0 as a process: the driver plus a ROUTER where clients (broker, `skippy generate`) submit.

Clients send Submit / Cancel / StatusQuery; each request's tokens go back as TokenEvents to the
client that asked, or, when its Submit names an `events_to` endpoint, straight there with a copy of
the final event to the submitter (skippy.driver.requests, skippy.driver.direct_events). The process logs `ready` once
stage 1 (and so the whole chain) has answered the handshake, and `stopped` after SIGTERM/SIGINT has
failed what was in flight and closed its sockets. If any of its loops fails, the requests in flight
get an error naming the cause, the process logs `process_failed` and exits with code 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from skippy.config import ServingOptions
from skippy.driver.direct_events import EventSinks
from skippy.driver.driver import Driver
from skippy.driver.requests import RequestEndpoint
from skippy.driver.speculative.setup import build_speculation
from skippy.driver.wire_certify import verdict_fields
from skippy.log import announce_ready, get_logger
from skippy.runtime.stage_runtime import StageRuntime
from skippy.supervise import Supervisor, ignore_signals, stop_on_signals
from skippy.transport.endpoints import request_endpoint
from skippy.transport.queues import RouterQueue

DELIVER_ON_STOP_S = 2.0  # how long final events of failed requests get to reach their clients


class Front(Protocol):
    """Supervised helper processes started next to stage 0 (the OpenAI front: broker + adapter)."""

    run_dir: Path

    async def wait_dead(self) -> tuple[str, int]: ...
    def restart(self, name: str, code: int) -> bool: ...  # True: it will be back (it logs child_died itself)
    def log_path(self, name: str) -> Path: ...
    def stop(self) -> Any: ...


FrontStarter = Callable[[ServingOptions], tuple[Front, str]]


class DriverProcess:
    def __init__(self, options: ServingOptions, runtime: StageRuntime, start_front: FrontStarter | None = None) -> None:
        self.log = get_logger()
        self.stopped = asyncio.Event()
        self.supervisor = Supervisor(self.log, self.stopped)
        self.driver = Driver(options, runtime, supervisor=self.supervisor,
                             speculation=build_speculation(options, runtime))
        self.runtime = runtime
        self.sinks = EventSinks()
        self.requests = RequestEndpoint(self.driver, self.sinks, self.log,
                                        events_to_overflow=self.driver.telemetry.events_to_overflow.inc)
        self.start_front = start_front

    async def run(self) -> int:
        stop_on_signals(self.stopped)
        router: RouterQueue | None = None
        front: Front | None = None
        try:
            await self.driver.start()
            assert self.driver.inbound is not None
            router = RouterQueue(self.driver.ctx, request_endpoint(self.driver.inbound.endpoint))
            cfg = self.driver.options.config
            announce_ready(self.log, layer_start=cfg.layer_start, layer_end=cfg.layer_end,
                          endpoint=self.driver.inbound.endpoint, request_endpoint=router.endpoint,
                          n_embd=self.runtime.n_embd, final=self.runtime.is_final, eval_callback=self.runtime.eval_callback,
                          max_iterations_in_flight=self.driver.max_iterations, prefill=self.driver.prefill.to_dict(),
                          wire=verdict_fields(self.driver.wire_verdict))
            self.supervisor.spawn("request endpoint", self.requests.serve(router))
            if self.driver.options.openai is not None and self.start_front is not None:
                started, url = await asyncio.to_thread(self.start_front, self.driver.options)
                front = started
                self.log.info("openai_ready", url=url, logs=str(started.run_dir))
                self.supervisor.spawn("front watch", self._watch(started))
            await self.stopped.wait()
        finally:
            ignore_signals()
            await self._shutdown(router, front)
        stats = self.driver.stats
        credits = self.driver.downstream.credits.stats if self.driver.downstream is not None else None
        self.log.info("stopped", exit_code=self.supervisor.exit_code, iterations=stats.iterations,
                      max_rows=stats.max_rows, max_sessions=stats.max_sessions, max_in_flight=stats.max_in_flight,
                      credits=vars(credits) if credits else None, prefix_cache=self.driver.prefix.snapshot(),
                      stage_prefix_cache=self.runtime.prefix.summary() if self.runtime.prefix else None)
        return self.supervisor.exit_code

    async def _shutdown(self, router: RouterQueue | None, front: Front | None) -> None:
        try:
            if front is not None:
                await asyncio.to_thread(front.stop)
            senders = self.requests.senders
            if senders:  # final events (e.g. of requests failed by a crash) reach their clients
                await asyncio.wait(senders, timeout=DELIVER_ON_STOP_S)
            for task in list(senders):
                task.cancel()
        finally:
            self.sinks.close()
            if router is not None:
                router.close(linger_ms=500)  # before the driver terms the shared context
            try:
                await self.driver.close()
            finally:
                self.runtime.close()

    async def _watch(self, front: Front) -> None:
        """A dead broker or adapter is restarted with backoff (stage 0 keeps serving its pipeline); one
        that has died too often in a row stops stage 0 (exit 1), as `skippy up` stops."""
        while True:
            name, code = await front.wait_dead()
            if not front.restart(name, code):
                self.supervisor.fail(f"the OpenAI front's {name} exited with code {code} and is not restarted"
                                     f" (log {front.log_path(name)})")
                return
