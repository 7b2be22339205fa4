"""What the Responses and Anthropic Messages translations share: a request of either API becomes the
/v1/chat/completions body it means (`Translated`), which runs through the chat route's own parsing and
pipeline (skippy.adapter.openai_request, skippy.adapter.completions): chat template, tool prompt and call
grammar, response format, sampling checks, stops, admission, usage. An error the chat parsing raises
names the chat field (`tools[0].function.parameters...`, `max_tokens`); `renames` maps it back to the
API's own (`tools[2].parameters...`, `max_output_tokens`), message text included.

Both render the generation's pieces back through an `EventRenderer` (their event streams; a response
not streamed is the same events' final object): `stream_events` for a stream, `drain` for a whole one.
Also the small checks both translations use on their bodies: fields known or refused, the tools
(`chat_tools`), a nested format object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from skippy.adapter.completions import Generation, Piece, Run
from skippy.adapter.openai_request import GenerationRequest
from skippy.adapter.request_fields import ignore_unknown
from skippy.http.errors import HttpError, invalid
from skippy.http.routing import Handler, Response, StreamResponse, json_response
from skippy.http.sse import with_pings
from skippy.log import get_logger
from skippy.protocol.stats import RequestStats

Renames = list[tuple[str, str]]
UP_TO_CONTEXT = 2**31 - 1
Route = tuple[str, str, Handler]  # (method, path, handler): what each API adds to the adapter's route table


@dataclass
class Translated:
    """An agent-API request as a chat completions body, its stop strings and how to name its fields back."""

    body: dict[str, Any]
    renames: Renames = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # set after parsing: Anthropic allows more than chat's 4
    stop_param: str = "stop"
    prompt_param: str = "messages"
    up_to_context: bool = False  # no max_tokens given: generate until the context is full (not the adapter's default)


def _renamed(param: str, renames: Renames) -> str:
    for old, new in renames:
        if param == old or param.startswith((old + ".", old + "[")):
            return new + param[len(old):]
    return param


def rename(exc: HttpError, renames: Renames) -> HttpError:
    """`exc` with its param (and the message that starts with it) named as the API's request names it."""
    if exc.param is None:
        return exc
    param = _renamed(exc.param, renames)
    if param == exc.param:
        return exc
    # its kind too (a PromptTooLong keeps what the Anthropic route words its own way); copy.copy cannot: an
    # exception is copied by calling its class with its args, which HttpError's signature does not take
    renamed = exc.__class__.__new__(exc.__class__)
    renamed.__dict__.update(exc.__dict__)
    renamed.message = param + exc.message[len(exc.param):] if exc.message.startswith(exc.param) else exc.message
    renamed.param = param
    renamed.args = (renamed.message,)
    return renamed


def parse_translated(translated: Translated, generation: Generation) -> GenerationRequest:
    """The chat request the translation means, the model's sampling defaults filled in (its errors renamed)."""
    try:
        req = generation.parse(translated.body, "chat")
    except HttpError as exc:
        raise rename(exc, translated.renames) from None
    if translated.stop and req.sampling.grammar is not None:
        raise invalid(translated.stop_param, "cannot be combined with tools or a JSON format (a stop string could cut"
                                             " the output)")
    req.stop = translated.stop
    if translated.up_to_context and req.max_tokens is None:
        req.max_tokens = UP_TO_CONTEXT  # Generation.start clamps it to what the context leaves
    return req


async def start_translated(generation: Generation, translated: Translated, request_id: str,
                           api: str) -> tuple[GenerationRequest, Run]:
    """Parse and submit; the first token has arrived when this returns (errors before it renamed)."""
    req = parse_translated(translated, generation)
    try:
        return req, await generation.start(req, request_id, translated.prompt_param, api)
    except HttpError as exc:
        raise rename(exc, translated.renames) from None


def count_translated(generation: Generation, translated: Translated) -> int:
    """The prompt's length in tokens, tools prompt included (the token counting routes)."""
    return len(generation.prompt_ids(parse_translated(translated, generation)))


def check_fields(body: Any, known: Iterable[str], refused: dict[str, str]) -> dict[str, Any]:
    """`body` as an object; a refused non-null field is a 400 naming it with its reason, an unknown one goes to
    `ignore_unknown` (skippy.adapter.request_fields)."""
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object", code="invalid_value")
    for name, value in body.items():
        if value is not None and name in refused:
            raise invalid(name, refused[name], "unsupported_parameter")
    names = set(known)
    ignore_unknown(name for name, value in body.items() if value is not None and name not in names)
    return body


def chat_tools(raw: Any, renames: Renames, function: Callable[[dict[str, Any], str], dict[str, Any] | None],
               paths: dict[str, str], api: str) -> list[dict[str, Any]]:
    """An API's `tools` as chat function tools: `function(tool, param)` gives a tool's chat `function` object, or
    None for a tool this server leaves out (logged once per request as `{api}_tools_ignored`, each `name (type)`).
    `paths` maps a chat tool's field paths to the API's (`{"function": ""}`: chat's tools[k].function.x is tools[i].x)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("tools", "expected a list of tools")
    tools: list[dict[str, Any]] = []
    ignored: list[str] = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}]", "expected a tool object")
        converted = function(tool, f"tools[{i}]")
        if converted is None:
            ignored.append(f"{tool.get('name') or tool.get('type')} ({tool.get('type') or 'deferred'})")
            continue
        renames += [(f"tools[{len(tools)}].{chat}", f"tools[{i}]{own}") for chat, own in paths.items()]
        tools.append({"type": "function", "function": converted})
    if ignored:
        get_logger().info(f"{api}_tools_ignored", tools=ignored)
    return tools


def format_of(value: Any, param: str, keys: set[str], expected: str) -> dict[str, Any] | None:
    """`value`'s `format` object (None when it or `value` is unset); a key of `value` not among `keys` goes to
    `ignore_unknown` as `param.key` (a client's newer option: ignored, or refused under strict)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(param, f"expected {expected}")
    ignore_unknown(f"{param}.{key}" for key, item in value.items() if key not in keys and item is not None)
    fmt = value.get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise invalid(f"{param}.format", "expected an object with a type")
    return fmt


async def respond(renderer: EventRenderer, req: GenerationRequest, run: Run,
                  ping_interval_s: float | None = None) -> Response | StreamResponse:
    """The generation as the API's stream (with SSE comment pings while it is silent, a long prompt prefilling),
    or (not streamed) the final object its events build."""
    if req.stream:
        return StreamResponse(with_pings(stream_events(renderer, run.pieces, run.rid), ping_interval_s))
    await drain(renderer, run.pieces)
    return json_response(renderer.final)


def keep(body: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The fields of `body` among `names` that are set (a null is not sent)."""
    return {name: body[name] for name in names if body.get(name) is not None}


class EventRenderer(Protocol):
    """An API's stream events from the generation's pieces; each call returns the SSE events to send.
    `final`: the whole response object, once `finish` has run."""

    final: dict[str, Any] | None

    def start(self) -> list[bytes]: ...

    def piece(self, piece: Piece) -> list[bytes]: ...

    def finish(self, piece: Piece, n_tokens: int, stats: RequestStats | None) -> list[bytes]: ...

    def fail(self, exc: HttpError) -> list[bytes]: ...


async def _events(renderer: EventRenderer, pieces: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
    """Every event of a generation that succeeds; a failure raises (HttpError) where it happens."""
    for event in renderer.start():
        yield event
    n_tokens = 0
    stats: RequestStats | None = None
    async for piece in pieces:
        n_tokens += piece.n_tokens
        stats = piece.stats or stats
        for event in renderer.piece(piece):
            yield event
        if piece.finish_reason is not None:
            for event in renderer.finish(piece, n_tokens, stats):
                yield event


async def stream_events(renderer: EventRenderer, pieces: AsyncIterator[Piece], generation_id: str) -> AsyncIterator[bytes]:
    """A stream that never ends without its final event or the API's error event, whatever broke."""
    try:
        async for event in _events(renderer, pieces):
            yield event
    except HttpError as exc:
        for event in renderer.fail(exc):
            yield event
    except Exception as exc:
        get_logger().exception("stream_failed", generation_id=generation_id)
        for event in renderer.fail(HttpError(502, f"generation failed: {exc!r}", type="server_error",
                                             code="pipeline_failed")):
            yield event


async def drain(renderer: EventRenderer, pieces: AsyncIterator[Piece]) -> None:
    """Run a generation not streamed through the renderer, which then holds the final object."""
    async for _ in _events(renderer, pieces):
        pass
