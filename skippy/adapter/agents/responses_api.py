"""The OpenAI Responses API: `POST /v1/responses` and `POST /v1/responses/input_tokens`, over the chat route's
pipeline (the request is translated by skippy.adapter.agents.responses_request; errors in OpenAI's envelope).

A response is built from the stream's own events, so streamed and whole responses agree: the stream
is `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
for a message `response.content_part.added`, `response.output_text.delta`... `response.output_text.done`,
`response.content_part.done`, for a function call `response.function_call_arguments.delta`...
`.done`, then `response.output_item.done`, and last `response.completed`, or `response.incomplete`
(`incomplete_details.reason: "max_output_tokens"`) when `max_output_tokens` cut it, or `response.failed`
(`error`) when the pipeline failed after the first token. Every event has `event:` and a
`sequence_number` from 0; item events carry `output_index` and `item_id`, as the `openai` SDK's
accumulator (`client.responses.stream`) and Codex read them. An output is one message or one call.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from skippy.adapter.agents.responses_request import echo_fields, translate_responses
from skippy.adapter.agents.translation import Route, count_translated, respond, start_translated
from skippy.adapter.completions import Generation, Piece
from skippy.adapter.grammar.tool_output import CallDelta
from skippy.adapter.openai_response import usage as chat_usage
from skippy.http.errors import HttpError
from skippy.http.routing import Request, Response, StreamResponse, json_response
from skippy.http.sse import sse_event
from skippy.protocol.stats import RequestStats


def response_usage(n_prompt: int, n_tokens: int, stats: RequestStats | None) -> dict[str, Any]:
    cached = chat_usage(n_prompt, n_tokens, stats)["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": n_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_prompt + n_tokens}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseEvents:
    """One response's events (an EventRenderer); `final` is the Response object once it finished."""

    def __init__(self, generation_id: str, model: str, echo: dict[str, Any], n_prompt: int) -> None:
        self.id = f"resp_{generation_id}"
        self.model, self.echo, self.n_prompt = model, echo, n_prompt
        self.created_at = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the output item being generated (the last of `output`)
        self.text = ""  # the open message's text so far
        self.final: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse_event(data, event=kind)

    def _item_event(self, kind: str, **fields: Any) -> bytes:
        assert self.open is not None
        return self._event(kind, item_id=self.open["id"], output_index=len(self.output) - 1, **fields)

    def _response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": list(self.output), "usage": None, "error": None,
                "incomplete_details": None, **self.echo, **fields}

    def start(self) -> list[bytes]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _add(self, item: dict[str, Any]) -> bytes:
        self.open = item
        self.output.append(item)
        return self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))

    def _open_message(self) -> list[bytes]:
        added = self._add({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "in_progress",
                           "role": "assistant", "content": []})
        self.text = ""
        return [added, self._item_event("response.content_part.added", content_index=0, part=_part(""))]

    def _open_call(self, call: CallDelta) -> bytes:
        return self._add({"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "in_progress",
                          "call_id": call.call_id, "name": call.name, "arguments": ""})

    def _close(self, status: str) -> list[bytes]:
        item, events = self.open, []
        if item is None:
            return []
        if item["type"] == "message":
            part = _part(self.text)
            events += [self._item_event("response.output_text.done", content_index=0, text=self.text, logprobs=[]),
                       self._item_event("response.content_part.done", content_index=0, part=part)]
            item["content"] = [part]
        else:
            events.append(self._item_event("response.function_call_arguments.done", arguments=item["arguments"]))
        item["status"] = status
        events.append(self._event("response.output_item.done", output_index=len(self.output) - 1, item=item))
        self.open = None
        return events

    def piece(self, piece: Piece) -> list[bytes]:
        events: list[bytes] = []
        if piece.text:
            if self.open is None or self.open["type"] != "message":
                events += self._close("completed") + self._open_message()
            self.text += piece.text
            events.append(self._item_event("response.output_text.delta", content_index=0, delta=piece.text, logprobs=[]))
        for call in piece.calls:
            if call.call_id is not None:
                events += self._close("completed")
                events.append(self._open_call(call))
            if call.arguments:
                assert self.open is not None
                self.open["arguments"] += call.arguments
                events.append(self._item_event("response.function_call_arguments.delta", delta=call.arguments))
        return events

    def finish(self, piece: Piece, n_tokens: int, stats: RequestStats | None) -> list[bytes]:
        cut = piece.finish_reason == "length"
        events = [] if self.output else self._open_message()  # nothing generated: an empty message
        events += self._close("incomplete" if cut else "completed")
        usage = response_usage(self.n_prompt, n_tokens, stats)
        if cut:
            self.final = self._response("incomplete", usage=usage, incomplete_details={"reason": "max_output_tokens"})
            return [*events, self._event("response.incomplete", response=self.final)]
        self.final = self._response("completed", usage=usage, completed_at=int(time.time()))
        return [*events, self._event("response.completed", response=self.final)]

    def fail(self, exc: HttpError) -> list[bytes]:
        code = "rate_limit_exceeded" if exc.status == 429 else "server_error"
        failed = self._response("failed", error={"code": code, "message": f"{exc.code}: {exc.message}"})
        return [self._event("response.failed", response=failed)]


class ResponsesApi:
    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    def routes(self) -> list[Route]:
        return [("POST", "/v1/responses", self.create), ("POST", "/v1/responses/input_tokens", self.input_tokens)]

    async def create(self, request: Request) -> Response | StreamResponse:
        body = request.json()
        req, run = await start_translated(self.generation, translate_responses(body), request.request_id, "responses")
        events = ResponseEvents(run.rid, self.generation.model_id, echo_fields(body), run.n_prompt)
        return await respond(events, req, run, self.generation.ping_interval_s)

    async def input_tokens(self, request: Request) -> Response:
        body = request.json()
        if isinstance(body, dict) and body.get("model") is None:  # optional here
            body["model"] = self.generation.model_id
        count = count_translated(self.generation, translate_responses(body))
        return json_response({"object": "response.input_tokens", "input_tokens": count})
