"""The generation routes (/v1/chat/completions, /v1/completions, /infill): request -> token ids for the
broker -> text, stream chunks, tool calls and usage back.

It applies the chat template, tokenizes, checks the sampling grammar against the vocabulary,
detokenizes incrementally (UTF-8 safe), enforces stop strings (no partial stop string is ever sent),
reads tool calls out of the text (skippy.adapter.grammar.tool_output) and maps broker errors to HTTP by
`skippy.protocol.kinds.http_status` (a 429 with Retry-After).
A client that disconnects has its generation cancelled at once as abandoned, which frees its lane. No response
ends without a finish reason or an OpenAI error: a stream that breaks (the broker lost, the adapter
stopping: skippy.client fails the pending request) ends with an `{"error": ...}` event and `[DONE]`,
a response not streamed is a 502/503 with the error envelope. A request lost with its stage 0 or the
broker resumes from the tokens it has (skippy.adapter.resume), and one that finds no pipeline ready
waits for one within the same deadline.
A stream whose first token has not come within the SSE ping interval (a long prompt prefilling, or
waiting for a lane) starts anyway and carries `: ping` comments while silent (skippy.http.sse.with_pings);
an error after that arrives as an error event. With `return_progress: true` (llama-server's field) a
stream carries `prompt_progress` chunks (`total`, `cache`, `processed`, `time_ms`, and `stages`: each stage's
prefill tokens/s) as stage 0 gets each prefill chunk back through every stage.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from skippy.adapter.chat_template import ChatTemplate
from skippy.adapter.context_errors import prompt_error
from skippy.adapter.grammar.tool_output import CallDelta, ToolCallReader, merge_calls
from skippy.adapter.infill import FimTokens, fim_prompt, infill_completion
from skippy.adapter.openai_request import GenerationRequest, parse_generation
from skippy.adapter.openai_response import LogprobEntry, ResponseShape, logprob_entry, timings, usage
from skippy.adapter.request_metrics import Metrics
from skippy.adapter.resume import ResumingClient
from skippy.adapter.sampling_defaults import SamplingDefaults
from skippy.adapter.stops import StopMatcher
from skippy.adapter.tokenize import check_tokens
from skippy.config import prompt_length_error
from skippy.http.errors import HttpError, invalid
from skippy.http.routing import Request, Response, StreamResponse, json_response
from skippy.http.sse import DEFAULT_PING_INTERVAL_S, SSE_DONE, sse_event, with_pings
from skippy.log import get_logger
from skippy.protocol import PromptProgress, Status, TokenEvents
from skippy.protocol.kinds import http_status
from skippy.protocol.stats import RequestStats
from skippy.request_events import PipelineUnavailable
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.grammar_sampler import check_grammar
from skippy.runtime.tokenizer import IncrementalDecoder, Tokenizer

TYPE_BY_STATUS = {429: "rate_limit_error", 503: "service_unavailable", 502: "server_error", 400: "invalid_request_error"}


def event_error(event: TokenEvents) -> HttpError:
    code = event.code or "pipeline_failed"
    status = http_status(code)
    headers = [("retry-after", "1")] if status == 429 else []
    return HttpError(status, event.error or "generation failed", type=TYPE_BY_STATUS.get(status, "server_error"),
                     code=code, headers=headers)


@dataclass
class Piece:
    text: str
    entries: list[LogprobEntry]
    n_tokens: int = 1  # generated tokens this piece accounts for
    finish_reason: str | None = None
    stats: RequestStats | None = None  # on the last piece: the request's numbers from stage 0
    calls: list[CallDelta] = field(default_factory=list)  # tool-call deltas (chat with tools)
    progress: PromptProgress | None = None  # a prompt progress report (return_progress), no text
    stop_sequence: str | None = None  # the stop string that ended the generation (finish_reason "stop")


@dataclass
class Run:
    """A submitted generation whose first event has arrived, or whose ping interval has passed: its id, prompt
    length and pieces to come."""

    rid: str
    n_prompt: int
    pieces: AsyncIterator[Piece]


async def read_calls(pieces: AsyncIterator[Piece], reader: ToolCallReader) -> AsyncIterator[Piece]:
    """The pieces with the text that forms a tool call moved into call deltas."""
    async for piece in pieces:
        piece.text, piece.calls = reader.push(piece.text)
        if piece.finish_reason is not None:
            tail, calls, piece.finish_reason = reader.finish(piece.finish_reason)
            piece.text += tail
            piece.calls += calls
        yield piece


@dataclass
class Generation:
    broker: ResumingClient  # the broker's PipelineClient, resuming what a dead stage 0 or broker lost
    tokenizer: Tokenizer
    template: ChatTemplate
    model_id: str
    default_max_tokens: int
    metrics: Metrics
    status: Callable[[], Awaitable[Status]]
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    ping_interval_s: float | None = DEFAULT_PING_INTERVAL_S  # None: no SSE pings
    log: Any = field(default_factory=get_logger)

    def __post_init__(self) -> None:
        self.fim = FimTokens.of(self.tokenizer)

    def parse(self, body: Any, kind: str) -> GenerationRequest:
        """A request body as the generation routes read it (the model's sampling defaults filled in)."""
        return parse_generation(body, kind, self.model_id, self.sampling_defaults)

    def prompt_ids(self, req: GenerationRequest) -> list[int]:
        """The token ids the pipeline is given for `req` (a chat's messages through the chat template)."""
        if req.kind == "chat":
            text = self.template.apply(req.messages, tools=req.tools)
            return self.tokenizer.encode(text, add_special=True, parse_special=True)
        if req.suffix is not None:
            self.fim.require("suffix")
            if req.prompt_text is None:
                raise invalid("suffix", "needs the prompt as text (the prefix), not token ids")
            return fim_prompt(self.tokenizer, self.fim, req.prompt_text, req.suffix)
        if req.prompt_ids is not None:
            return check_tokens(self.tokenizer, req.prompt_ids, "prompt")
        return self.tokenizer.encode(req.prompt_text or "", add_special=True)

    def _check(self, req: GenerationRequest) -> None:
        bad = [t for t in req.sampling.logit_bias if not 0 <= t < self.tokenizer.n_vocab]
        if bad:
            raise HttpError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary", param="logit_bias")
        if req.sampling.grammar is not None:
            try:
                check_grammar(self.tokenizer.vocab, req.sampling.grammar)
            except RuntimeUsageError as exc:
                param = "tools" if req.tools is not None else "response_format"
                raise invalid(param, str(exc), "unsupported_schema") from None

    async def __call__(self, request: Request, kind: str) -> Response | StreamResponse:
        return await self.serve(request.json(), kind, request.request_id)

    async def infill(self, request: Request) -> Response | StreamResponse:
        """POST /infill (skippy.adapter.infill): a completion of the FIM prompt, in llama-server's native shape."""
        body = infill_completion(request.json(), self.tokenizer, self.fim, self.model_id)
        return await self.serve(body, "completion", request.request_id, shape_kind="infill")

    async def serve(self, body: Any, kind: str, request_id: str, shape_kind: str | None = None) -> Response | StreamResponse:
        req = self.parse(body, kind)
        run = await self.start(req, request_id, "messages" if kind == "chat" else "prompt")
        shape = ResponseShape(shape_kind or kind, self.model_id, run.rid)
        if req.stream:
            return StreamResponse(with_pings(self._stream(shape, run.pieces, req, run.n_prompt), self.ping_interval_s))
        return await self._complete(shape, run.pieces, run.n_prompt)

    async def start(self, req: GenerationRequest, request_id: str, prompt_param: str, api: str | None = None) -> Run:
        """Submit `req` and wait for its first event (a stream: at most the ping interval): what every generation
        route (chat, completions, infill, and the Responses and Anthropic translations) runs. An error before the
        first token is an HttpError (a prompt that does not fit names `prompt_param`); `api` labels the route in
        logs and metrics (default: the kind)."""
        self._check(req)
        ids = self.prompt_ids(req)
        try:
            status: Status | None = await self.status()
        except PipelineUnavailable as exc:
            status, why = None, str(exc)
        if status is None or status.ctx_size <= 0:  # the broker reports ctx_size 0 while no pipeline is ready
            why = "no pipeline is ready" if status is not None else why
            status = await self.broker.wait_ready()  # a restart in progress: wait for it, within the resume deadline
            if status is None:
                raise HttpError(503, self.broker.not_ready(why),
                                type="service_unavailable", code="unavailable")
        ctx = status.ctx_size
        unfit = prompt_length_error(len(ids), ctx)
        if unfit is not None:
            raise prompt_error(unfit, prompt_param)  # a 400 context_length_exceeded (Anthropic words it its own way)
        max_tokens = min(req.max_tokens or self.default_max_tokens, ctx - len(ids))  # clamped to what fits
        stop_tokens = frozenset() if req.ignore_eos else self.tokenizer.eog_tokens()
        rid = uuid.uuid4().hex
        started = time.perf_counter()
        events = await self.broker.submit(ids, req.sampling, max_tokens, stop_tokens, rid,
                                          progress=req.progress and req.stream)
        first: asyncio.Future[TokenEvents] = asyncio.ensure_future(events.__anext__())
        try:  # a stream starts (and pings) once the interval passes without a first event
            await asyncio.wait({first}, timeout=self.ping_interval_s if req.stream else None)
        except BaseException as exc:  # the client went away while it waited (or the adapter is stopping)
            first.cancel()
            await asyncio.shield(self.broker.cancel(rid, abandoned=isinstance(exc, asyncio.CancelledError)))
            raise
        if first.done() and first.result().finish_reason == "error":
            self.metrics.count_error(first.result().code or "pipeline_failed")
            raise event_error(first.result())
        kind = api or req.kind
        self.metrics.generation_started(rid, started, len(ids), kind)
        primed = self._pieces(rid, first, events, req)
        await anext(primed)  # from here on, however the pieces end (read or not), the generation ends
        pieces: AsyncIterator[Piece] = primed
        if req.tools is not None:
            pieces = read_calls(pieces, ToolCallReader(req.tools.forced, frozenset(t.name for t in req.tools.tools)))
        self.log.info("generation_started", request_id=request_id, generation_id=rid, kind=kind,
                      prompt_tokens=len(ids), max_tokens=max_tokens, stream=req.stream,
                      grammar=req.sampling.grammar is not None)
        return Run(rid, len(ids), pieces)

    async def _pieces(self, rid: str, first: asyncio.Future[TokenEvents], events: AsyncIterator[TokenEvents],
                      req: GenerationRequest) -> AsyncGenerator[Piece, None]:
        """One piece per step's event: its text (stop strings held back and enforced), ending with one that has
        finish_reason. Its first piece is empty, taken by `start`, so that its `finally` runs even when the
        pieces are never read (the client left in between: the generator is closed, or collected, unstarted)."""
        decoder, stops = IncrementalDecoder(self.tokenizer), StopMatcher(req.stop)
        event: TokenEvents | None = None
        finished = abandoned = False
        try:
            yield Piece("", [], 0)
            event = await first
            while True:
                if event.progress is not None:
                    yield Piece("", [], 0, progress=event.progress)
                if event.final:
                    finished = True
                    if event.finish_reason == "error":
                        raise event_error(event)
                    self.metrics.observe_stats(event.stats)
                    yield Piece(stops.push(decoder.flush()) + stops.flush(), [], 0, event.finish_reason, event.stats)
                    return
                if event.tokens:
                    piece = self._piece(event, decoder, stops)
                    self.metrics.tokens(rid, piece.n_tokens)
                    yield piece
                    if stops.stopped:
                        return
                event = await events.__anext__()
        except (GeneratorExit, asyncio.CancelledError):  # the client went away (its stream closed, its handler cancelled)
            abandoned = True
            raise
        finally:
            first.cancel()
            self.metrics.generation_done(rid, event, stops.stopped)
            if not finished:  # stop string, client gone, or error: free the lane now
                await asyncio.shield(self.broker.cancel(rid, abandoned=abandoned))

    def _piece(self, event: TokenEvents, decoder: IncrementalDecoder, stops: StopMatcher) -> Piece:
        """A step's tokens as text; a stop string ends it at the token that completed it."""
        texts: list[str] = []
        for n, token in enumerate(event.tokens, 1):
            texts.append(stops.push(decoder.push(token)))
            if stops.stopped:
                entries = [logprob_entry(lp, self.tokenizer.piece) for lp in event.logprobs[:n]]
                return Piece("".join(texts), entries, n, "stop", stop_sequence=stops.matched)
        entries = [logprob_entry(lp, self.tokenizer.piece) for lp in event.logprobs]
        return Piece("".join(texts), entries, len(event.tokens))

    async def _complete(self, shape: ResponseShape, pieces: AsyncIterator[Piece], n_prompt: int) -> Response:
        texts, entries, calls, n_tokens, finish = [], [], [], 0, "stop"
        stats: RequestStats | None = None
        async for piece in pieces:
            texts.append(piece.text)
            entries += piece.entries
            calls += piece.calls
            n_tokens += piece.n_tokens
            finish = piece.finish_reason or finish
            stats = piece.stats or stats
        return json_response(shape.full("".join(texts), finish, usage(n_prompt, n_tokens, stats), entries, timings(stats),
                                        merge_calls(calls)))

    async def _stream(self, shape: ResponseShape, pieces: AsyncIterator[Piece], req: GenerationRequest,
                      n_prompt: int) -> AsyncIterator[bytes]:
        if shape.kind == "chat":
            yield sse_event(shape.chunk("", role=True))
        offset = n_tokens = 0
        stats: RequestStats | None = None
        try:
            async for piece in pieces:
                n_tokens += piece.n_tokens
                stats = piece.stats or stats
                if piece.progress is not None:
                    yield sse_event(shape.progress_chunk(piece.progress))
                if piece.text or piece.entries or piece.calls:
                    calls = [c.to_json() for c in piece.calls]
                    text = piece.text if piece.text or not calls else None
                    yield sse_event(shape.chunk(text, entries=piece.entries, offset=offset, calls=calls))
                    offset += len(piece.text)
                if piece.finish_reason is not None:
                    last = shape.chunk(None if shape.kind == "chat" else "", piece.finish_reason)
                    yield sse_event({**last, **timings(piece.stats)})
            if req.include_usage:
                yield sse_event(shape.usage_chunk(usage(n_prompt, n_tokens, stats)))
        except HttpError as exc:
            yield sse_event(json.loads(exc.body()))
        except Exception as exc:  # never a bare end: whatever broke, the client reads an error event
            self.log.exception("stream_failed", generation_id=shape.request_id)
            yield sse_event(json.loads(HttpError(502, f"generation failed: {exc!r}", type="server_error",
                                                 code="pipeline_failed").body()))
        if shape.kind != "infill":  # llama-server's native stream has no [DONE]
            yield SSE_DONE
