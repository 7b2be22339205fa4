"""The OpenAI adapter: HTTP routes -> token ids for the broker -> text, stream chunks and usage back.

It applies the chat template, tokenizes, detokenizes incrementally (UTF-8 safe), enforces stop
strings (no partial stop string is ever sent), and maps broker errors to HTTP: queue_full and
admission_timeout -> 429 with Retry-After, unavailable -> 503, pipeline_failed -> 502. A client that
disconnects has its generation cancelled at once, which frees its lane.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from skippy.config import prompt_length_error
from skippy.driver.client import DriverClient
from skippy.driver.events import DriverUnavailable, TokenEvent
from skippy.http.chat_template import ChatTemplate
from skippy.http.errors import HttpError
from skippy.http.metrics import Metrics
from skippy.http.openai_request import GenerationRequest, parse_generation
from skippy.http.openai_response import LogprobEntry, ResponseShape, logprob_entry, timings, usage
from skippy.http.server import Request, Response, Router, StreamResponse, json_response
from skippy.http.sse import SSE_DONE, sse_event
from skippy.http.stops import StopMatcher
from skippy.log import get_logger
from skippy.protocol import Status
from skippy.runtime.tokenizer import IncrementalDecoder, Tokenizer

STATUS_BY_CODE = {"queue_full": 429, "admission_timeout": 429, "unavailable": 503, "pipeline_failed": 502,
                  "bad_request": 400, "context_length_exceeded": 400}
TYPE_BY_STATUS = {429: "rate_limit_error", 503: "service_unavailable", 502: "server_error", 400: "invalid_request_error"}


def event_error(event: TokenEvent) -> HttpError:
    code = event.code or "pipeline_failed"
    status = STATUS_BY_CODE.get(code, 502)
    headers = [("retry-after", "1")] if status == 429 else []
    return HttpError(status, event.error or "generation failed", type=TYPE_BY_STATUS.get(status, "server_error"),
                     code=code, headers=headers)


@dataclass
class Piece:
    text: str
    entries: list[LogprobEntry]
    n_tokens: int = 1  # generated tokens this piece accounts for
    finish_reason: str | None = None
    stats: tuple[tuple[str, float], ...] = ()  # on the last piece: the request's numbers from stage 0


class OpenAIAdapter:
    def __init__(self, broker: DriverClient, tokenizer: Tokenizer, template: ChatTemplate, model_id: str,
                 default_max_tokens: int = 16) -> None:
        self.broker = broker
        self.tokenizer = tokenizer
        self.template = template
        self.model_id = model_id
        self.default_max_tokens = default_max_tokens
        self.metrics = Metrics()
        self.log = get_logger()
        self._status: tuple[float, Status] | None = None

    def router(self) -> Router:
        router = Router()
        routes = [("GET", "/health", self.health), ("GET", "/readyz", self.readyz), ("GET", "/v1/models", self.models),
                  ("GET", "/metrics", self.metrics_text),
                  ("POST", "/v1/chat/completions", lambda r: self.generate(r, "chat")),
                  ("POST", "/v1/completions", lambda r: self.generate(r, "completion"))]
        for method, path, handler in routes:
            router.add(method, path, self._counted(path, handler))
        return router

    def _counted(self, path: str, handler: Any) -> Any:
        async def counted(request: Request) -> Response | StreamResponse:
            try:
                response = await handler(request)
            except HttpError as exc:
                self.metrics.requests[(path, exc.status)] += 1
                raise
            self.metrics.requests[(path, response.status)] += 1
            return response

        return counted

    async def status(self, max_age_s: float = 0.5) -> Status:
        now = time.monotonic()
        if self._status is None or now - self._status[0] > max_age_s:
            self._status = (now, await self.broker.status(timeout_s=2.0))
        return self._status[1]

    async def health(self, _: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, _: Request) -> Response:
        try:
            status = await self.status(max_age_s=0.0)
        except DriverUnavailable as exc:
            return json_response({"status": "not ready", "reason": str(exc)}, 503)
        if not status.ready:
            reason = f"stage {status.dead_stage} is down" if status.dead_stage else "no pipeline is ready"
            return json_response({"status": "not ready", "reason": reason}, 503)
        return json_response({"status": "ready", "running": status.running, "waiting": status.waiting})

    async def models(self, _: Request) -> Response:
        return json_response({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": 0, "owned_by": "skippy"}]})

    async def metrics_text(self, _: Request) -> Response:
        gauges: dict[str, float] = {}
        try:
            s = await self.status()
            gauges = {"pipeline_ready": float(s.ready), "requests_running": s.running, "requests_waiting": s.waiting,
                      "generation_concurrency": s.lane_count}
        except DriverUnavailable:
            gauges = {"pipeline_ready": 0.0}
        return Response(200, self.metrics.render(gauges).encode(), content_type="text/plain; version=0.0.4")

    # -- generation --------------------------------------------------------------------------
    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.kind == "chat":
            return self.tokenizer.encode(self.template.apply(req.messages), add_special=True, parse_special=True)
        return self.tokenizer.encode(req.prompt_text or "", add_special=True)

    async def generate(self, request: Request, kind: str) -> Response | StreamResponse:
        req = parse_generation(request.json(), kind, self.model_id)
        bad = [t for t in req.sampling.logit_bias if not 0 <= t < self.tokenizer.n_vocab]
        if bad:
            raise HttpError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary", param="logit_bias")
        ids = self._prompt_ids(req)
        try:
            ctx = (await self.status()).ctx_size
        except DriverUnavailable as exc:
            raise HttpError(503, str(exc), type="service_unavailable", code="unavailable") from None
        if ctx <= 0:  # the broker reports ctx_size 0 while no pipeline is ready
            raise HttpError(503, "no pipeline is ready", type="service_unavailable", code="unavailable")
        unfit = prompt_length_error(len(ids), ctx)
        if unfit is not None:
            raise HttpError(400, unfit.message, param="messages" if kind == "chat" else "prompt", code=unfit.code)
        max_tokens = min(req.max_tokens or self.default_max_tokens, ctx - len(ids))
        stop_tokens = frozenset() if req.ignore_eos else self.tokenizer.eog_tokens()
        rid = uuid.uuid4().hex
        started = time.perf_counter()
        handle = await self.broker.submit(ids, req.sampling, max_tokens, stop_tokens, request_id=rid)
        events = handle.__aiter__()
        try:
            first = await events.__anext__()
        except BaseException:
            await self.broker.cancel(rid)
            raise
        if first.finish_reason == "error":
            self.metrics.errors[first.code or "pipeline_failed"] += 1
            raise event_error(first)
        self.metrics.observe_ttft(time.perf_counter() - started)
        self.metrics.prompt_tokens += len(ids)
        shape = ResponseShape(kind, self.model_id, rid)
        pieces = self._pieces(rid, first, events, req)
        self.log.info("generation_started", request_id=request.request_id, generation_id=rid, kind=kind,
                      prompt_tokens=len(ids), max_tokens=max_tokens, stream=req.stream)
        if req.stream:
            return StreamResponse(self._stream(shape, pieces, req, len(ids)))
        return await self._complete(shape, pieces, len(ids))

    async def _pieces(self, rid: str, first: TokenEvent, events: AsyncIterator[TokenEvent],
                      req: GenerationRequest) -> AsyncIterator[Piece]:
        """Text deltas (stop strings held back and enforced) ending with one that has finish_reason."""
        decoder, stops = IncrementalDecoder(self.tokenizer), StopMatcher(req.stop)
        event: TokenEvent | None = first
        finished = False
        try:
            while event is not None:
                if event.final:
                    finished = True
                    if event.finish_reason == "error":
                        raise event_error(event)
                    self.metrics.observe_stats(event.stats)
                    yield Piece(stops.push(decoder.flush()) + stops.flush(), [], 0, event.finish_reason, event.stats)
                    return
                assert event.token is not None
                self.metrics.completion_tokens += 1
                entries = [logprob_entry(event.logprob, self.tokenizer.piece)] if event.logprob else []
                text = stops.push(decoder.push(event.token))
                if stops.stopped:
                    yield Piece(text, entries, 1, "stop")
                    return
                yield Piece(text, entries)
                event = await events.__anext__()
        finally:
            if not finished:  # stop string, client gone, or error: free the lane now
                await asyncio.shield(self.broker.cancel(rid))

    async def _complete(self, shape: ResponseShape, pieces: AsyncIterator[Piece], n_prompt: int) -> Response:
        texts, entries, n_tokens, finish = [], [], 0, "stop"
        stats: tuple[tuple[str, float], ...] = ()
        async for piece in pieces:
            texts.append(piece.text)
            entries += piece.entries
            n_tokens += piece.n_tokens
            finish = piece.finish_reason or finish
            stats = piece.stats or stats
        return json_response(shape.full("".join(texts), finish, usage(n_prompt, n_tokens), entries, timings(stats)))

    async def _stream(self, shape: ResponseShape, pieces: AsyncIterator[Piece], req: GenerationRequest,
                      n_prompt: int) -> AsyncIterator[bytes]:
        if shape.kind == "chat":
            yield sse_event(shape.chunk("", role=True))
        offset = n_tokens = 0
        try:
            async for piece in pieces:
                n_tokens += piece.n_tokens
                if piece.text or piece.entries:
                    yield sse_event(shape.chunk(piece.text, entries=piece.entries, offset=offset))
                    offset += len(piece.text)
                if piece.finish_reason is not None:
                    last = shape.chunk(None if shape.kind == "chat" else "", piece.finish_reason)
                    yield sse_event({**last, **timings(piece.stats)})
            if req.include_usage:
                yield sse_event(shape.usage_chunk(usage(n_prompt, n_tokens)))
        except HttpError as exc:
            yield sse_event(json.loads(exc.body()))
        yield SSE_DONE
