"""The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, over the chat route's
pipeline (the request is translated by skippy.adapter.agents.anthropic_request).

Errors, the API key's 401 included, come in Anthropic's envelope `{"type": "error", "error": {"type":
"invalid_request_error", "message": ...}}` with the same statuses as the OpenAI routes (`anthropic_envelope`; a
prompt over the context is Anthropic's "prompt is too long: N tokens > M maximum", skippy.adapter.context_errors);
the key is taken as `x-api-key` as well as a Bearer token (skippy.http.auth).

A message is built from the stream's own events, so streamed and whole messages agree: `message_start`
(usage.input_tokens), a `ping`, then per content block `content_block_start`, `content_block_delta`
(`text_delta`, or `input_json_delta` for a `tool_use` block's input), `content_block_stop`, then
`message_delta` (`stop_reason`: end_turn, stop_sequence with the `stop_sequence` hit, max_tokens, tool_use;
usage.output_tokens) and `message_stop`; a failure after the first token is an `error` event. One text
block or one tool_use block per message. Usage counts prompt tokens restored from the prefix cache as
`cache_read_input_tokens` (and leaves them out of `input_tokens`, as Anthropic does). A tool_use cut by
`max_tokens` has the input parsed so far in the stream, `{}` in a whole message.
"""

from __future__ import annotations

import json
from typing import Any

from skippy.adapter.agents.anthropic_request import translate_messages
from skippy.adapter.agents.translation import Route, count_translated, respond, start_translated
from skippy.adapter.completions import Generation, Piece
from skippy.adapter.context_errors import PromptTooLong
from skippy.adapter.openai_response import usage as chat_usage
from skippy.http.errors import HttpError
from skippy.http.routing import Handler, Request, Response, StreamResponse, json_response
from skippy.http.sse import sse_event
from skippy.log import get_logger
from skippy.protocol.stats import RequestStats

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class AnthropicError(HttpError):
    """An HttpError rendered in Anthropic's error envelope."""

    @classmethod
    def of(cls, exc: HttpError) -> AnthropicError:
        message = exc.unfit.anthropic_message() if isinstance(exc, PromptTooLong) else exc.message
        return cls(exc.status, message, type=exc.type, param=exc.param, code=exc.code, headers=exc.headers)

    def json(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": ERROR_TYPES.get(self.status, "api_error"), "message": self.message}}

    def body(self) -> bytes:
        return json.dumps(self.json()).encode()


def anthropic_envelope(handler: Handler) -> Handler:
    """`handler` with its errors (and an unexpected exception, as a 500) in Anthropic's envelope."""

    async def enveloped(request: Request) -> Response | StreamResponse:
        try:
            return await handler(request)
        except HttpError as exc:
            raise AnthropicError.of(exc) from None
        except Exception:
            get_logger().exception("http_handler_error", path=request.path, request_id=request.request_id)
            raise AnthropicError(500, "internal error", type="server_error", code="internal_error") from None

    return enveloped


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageEvents:
    """One message's events (an EventRenderer); `final` is the Message object once it finished."""

    def __init__(self, generation_id: str, model: str, n_prompt: int) -> None:
        self.id = f"msg_{generation_id}"
        self.model, self.n_prompt = model, n_prompt
        self.content: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the block being generated (the last of `content`)
        self.arguments = ""  # the open tool_use block's input JSON so far
        self.final: dict[str, Any] | None = None

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse_event({"type": kind, **fields}, event=kind)

    def _usage(self, n_tokens: int, stats: RequestStats | None) -> dict[str, Any]:
        cached = chat_usage(self.n_prompt, n_tokens, stats)["prompt_tokens_details"]["cached_tokens"]
        return {"input_tokens": self.n_prompt - cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached, "output_tokens": n_tokens}

    def _message(self, usage: dict[str, Any], stop_reason: str | None = None, stop_sequence: str | None = None,
                 content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content or [],
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def start(self) -> list[bytes]:
        return [self._event("message_start", message=self._message(self._usage(1, None))), self._event("ping")]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        events = self._close()
        self.open = block
        self.content.append(block)
        start = {**block, "input": {}} if block["type"] == "tool_use" else block
        return [*events, self._event("content_block_start", index=len(self.content) - 1, content_block=dict(start))]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        if self.open["type"] == "tool_use":
            self.open["input"] = _input(self.arguments)
        self.open = None
        return [self._event("content_block_stop", index=len(self.content) - 1)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=len(self.content) - 1, delta=delta)

    def piece(self, piece: Piece) -> list[bytes]:
        events: list[bytes] = []
        if piece.text:
            if self.open is None or self.open["type"] != "text":
                events += self._open({"type": "text", "text": ""})
            assert self.open is not None
            self.open["text"] += piece.text
            events.append(self._delta({"type": "text_delta", "text": piece.text}))
        for call in piece.calls:
            if call.call_id is not None:
                self.arguments = ""
                events += self._open({"type": "tool_use", "id": "toolu_" + call.call_id.removeprefix("call_"),
                                      "name": call.name, "input": {}})
            if call.arguments:
                self.arguments += call.arguments
                events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return events

    def finish(self, piece: Piece, n_tokens: int, stats: RequestStats | None) -> list[bytes]:
        events = self._close()
        reason = piece.finish_reason or "stop"
        sequence = piece.stop_sequence if reason == "stop" else None
        stop_reason = "stop_sequence" if sequence is not None else STOP_REASONS.get(reason, "end_turn")
        usage = self._usage(n_tokens, stats)
        self.final = self._message(usage, stop_reason, sequence, self.content)
        return [*events, self._event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": sequence},
                                     usage={"output_tokens": n_tokens}),
                self._event("message_stop")]

    def fail(self, exc: HttpError) -> list[bytes]:
        return [self._event("error", error=AnthropicError.of(exc).json()["error"])]


class MessagesApi:
    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self._substituted: set[str] = set()  # model names already logged as served by this model

    def _served(self, body: Any) -> Any:
        """`body` with its `model` set to the served one: Anthropic's clients name Anthropic's models (Claude Code
        its main and its small fast model, whatever it is pointed at), and this server has one model to answer them
        with. Logged once per name (`model_substituted`)."""
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or model == self.generation.model_id:
            return body
        if model not in self._substituted:
            self._substituted.add(model)
            self.generation.log.info("model_substituted", asked=model, served=self.generation.model_id)
        return {**body, "model": self.generation.model_id}

    def routes(self) -> list[Route]:
        return [("POST", "/v1/messages", self.create), ("POST", "/v1/messages/count_tokens", self.count_tokens)]

    async def create(self, request: Request) -> Response | StreamResponse:
        req, run = await start_translated(self.generation, translate_messages(self._served(request.json())),
                                          request.request_id, "messages")
        events = MessageEvents(run.rid, self.generation.model_id, run.n_prompt)
        return await respond(events, req, run, self.generation.ping_interval_s)

    async def count_tokens(self, request: Request) -> Response:
        count = count_translated(self.generation, translate_messages(self._served(request.json()), count_only=True))
        return json_response({"input_tokens": count})
