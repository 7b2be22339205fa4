"""Stage 0 as a process: the driver plus a ROUTER where clients (broker, `skippy generate`) submit.

Clients send Submit / Cancel / StatusQuery; each request's tokens go back as TokenEvents to the
client that asked. The process logs `ready` once stage 1 (and so the whole chain) has answered the
handshake, and `stopped` after SIGTERM/SIGINT has failed what was in flight and closed its sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from skippy.config import ServingOptions
from skippy.transport import request_endpoint
from skippy.driver.driver import Driver
from skippy.driver.events import DriverUnavailable, RequestHandle
from skippy.log import get_logger
from skippy.protocol import Cancel, Message, ProtocolError, Status, StatusQuery, Submit, TokenEvents
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_runtime import StageRuntime
from skippy.stage.links import ignore_signals, stop_on_signals
from skippy.transport import RouterQueue


class Front(Protocol):
    """Supervised helper processes started next to stage 0 (the OpenAI front: broker + adapter)."""

    run_dir: Path

    def dead(self) -> list[tuple[str, int]]: ...
    def log_path(self, name: str) -> Path: ...
    def stop(self) -> Any: ...


FrontStarter = Callable[[ServingOptions], tuple[Front, str]]


class DriverProcess:
    def __init__(self, options: ServingOptions, runtime: StageRuntime, start_front: FrontStarter | None = None) -> None:
        self.driver = Driver(options, runtime)
        self.runtime = runtime
        self.log = get_logger()
        self.stopped = asyncio.Event()
        self.forwarders: set[asyncio.Task[None]] = set()
        self.start_front = start_front

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop_on_signals(self.stopped)
        await self.driver.start()
        assert self.driver.inbound is not None
        router = RouterQueue(self.driver.ctx, request_endpoint(self.driver.inbound.endpoint))
        cfg = self.driver.options.config
        self.log.info("ready", layer_start=cfg.layer_start, layer_end=cfg.layer_end, endpoint=self.driver.inbound.endpoint,
                      request_endpoint=router.endpoint, n_embd=self.runtime.n_embd, final=self.runtime.is_final,
                      max_iterations_in_flight=self.driver.max_iterations)
        serving = loop.create_task(self._serve(router))
        front = None
        if self.driver.options.openai is not None and self.start_front is not None:
            front, url = await asyncio.to_thread(self.start_front, self.driver.options)
            self.log.info("openai_ready", url=url, logs=str(front.run_dir))
            loop.create_task(self._watch(front))
        await self.stopped.wait()
        ignore_signals()
        if front is not None:
            await asyncio.to_thread(front.stop)
        serving.cancel()
        for task in self.forwarders:
            task.cancel()
        router.close()  # before the driver terms the shared context
        await self.driver.close()
        self.runtime.close()
        stats = self.driver.stats
        self.log.info("stopped", iterations=stats.iterations, max_rows=stats.max_rows, max_sessions=stats.max_sessions,
                      max_in_flight=stats.max_in_flight, credits=vars(self.driver.credits.stats))
        return 0

    async def _watch(self, front: Front) -> None:
        """A dead broker or adapter is reported by name (stage 0 keeps serving its pipeline)."""
        reported: set[str] = set()
        while True:
            for name, code in front.dead():
                if name not in reported:
                    reported.add(name)
                    self.log.error("child_died", child=name, exit_code=code, log=str(front.log_path(name)))
            await asyncio.sleep(0.5)

    async def _serve(self, router: RouterQueue) -> None:
        while True:
            client, msg = await router.recv()
            await self._on_request(router, client, msg)

    async def _on_request(self, router: RouterQueue, client: bytes, msg: Message | ProtocolError) -> None:
        if isinstance(msg, Submit):
            try:
                sampling = SamplingParams.from_dict(msg.sampling)
                handle = self.driver.submit(list(msg.prompt), sampling, msg.max_tokens, frozenset(msg.stop_tokens),
                                            msg.request_id)
            except (RuntimeUsageError, DriverUnavailable, TypeError, ValueError) as exc:
                self.log.warning("request_refused", request_id=msg.request_id, error=str(exc))
                code = "unavailable" if isinstance(exc, DriverUnavailable) else "bad_request"
                await router.send(client, TokenEvents(msg.request_id, (), "error", str(exc), code))
                return
            task = asyncio.get_running_loop().create_task(self._forward(router, client, handle))
            self.forwarders.add(task)
            task.add_done_callback(self.forwarders.discard)
        elif isinstance(msg, Cancel):
            self.driver.cancel(msg.request_id)
        elif isinstance(msg, StatusQuery):
            d = self.driver
            await router.send(client, Status(msg.nonce, d.dead is None, d.dead, len(d.running), len(d.waiting),
                                             self.runtime.spec.lane_count, self.runtime.spec.ctx_size))
        else:
            self.log.warning("bad_request", detail=str(msg)[:200])

    async def _forward(self, router: RouterQueue, client: bytes, handle: RequestHandle) -> Any:
        async for event in handle:
            tokens = () if event.token is None else (event.token,)
            logprobs = () if event.logprob is None else (event.logprob,)
            await router.send(client, TokenEvents(handle.request_id, tokens, event.finish_reason, event.error,
                                                  event.code, logprobs))
