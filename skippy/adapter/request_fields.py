"""Every request field of /v1/chat/completions and /v1/completions is honoured, accepted as meaningless
here, or refused with a 400 naming it; and what every route does with a field it does not know.

The README's "Request fields" table is this module in prose; keep them together. A field sent as
null counts as not sent. A field no route knows (agent clients send their own: Codex's `client_metadata`,
Claude Code's `context_management`) is ignored, logged once per name per process
(`request_fields_ignored`) and counted, or refused with a 400 under `--strict-request-fields`
(`UnknownFields`, bound to each route by the adapter's route table; `ignore_unknown` is what the routes call).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar

from skippy.http.errors import invalid
from skippy.http.routing import Request
from skippy.log import get_logger

Answer = TypeVar("Answer")

COMMON = frozenset({"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop",
                    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "n", "response_format",
                    # llama.cpp's extensions
                    "top_k", "min_p", "repeat_penalty", "ignore_eos", "return_progress"})
HONOURED = {
    "chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                      "parallel_tool_calls", "modalities"},
    "completion": COMMON | {"prompt", "best_of", "echo", "suffix"},
}
OTHER_ROUTE = {"chat": HONOURED["completion"] - HONOURED["chat"], "completion": HONOURED["chat"] - HONOURED["completion"]}
ROUTE_OF = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# accepted and meaningless on a self-hosted server: end-user ids, stored-completion metadata, cache hints
MEANINGLESS = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                         "prompt_cache_options", "service_tier", "store"})


def _never(reason: str) -> Callable[[Any], str | None]:
    return lambda value: reason


def _unless(ok: Callable[[Any], bool], reason: str) -> Callable[[Any], str | None]:
    return lambda value: None if ok(value) else reason


REFUSED: dict[str, Callable[[Any], str | None]] = {
    "audio": _never("audio output is not supported (text only)"),
    "functions": _never("deprecated; use tools"),
    "function_call": _never("deprecated; use tool_choice"),
    "prediction": _never("predicted outputs are not supported"),
    "reasoning_effort": _never("this model does not reason; reasoning_effort is not supported"),
    "verbosity": _never("verbosity is not supported"),
    "web_search_options": _never("web search is not supported"),
    "moderation": _never("moderation is not supported"),
    "modalities": _unless(lambda v: v == ["text"], 'only ["text"] is supported'),
    "store": _unless(lambda v: v is False, "completions are not stored; store must be false"),
    "service_tier": _unless(lambda v: v in ("auto", "default"), 'only "auto" and "default" are served'),
    "best_of": _unless(lambda v: v == 1, "only best_of = 1 is supported"),
    "echo": _unless(lambda v: v is False, "echo is not supported"),
}


class UnknownFields:
    """Request fields a route does not know: refused with a 400 naming the first (`strict`), or ignored, each
    name logged once per process and every one counted (`count(route, field)`; past `MAX_NAMES` names, a new
    one is counted as `(other)` and not logged, so clients cannot grow the metrics without bound)."""

    MAX_NAMES = 200

    def __init__(self, strict: bool = False, count: Callable[[str, str], None] | None = None) -> None:
        self.strict = strict
        self.count = count
        self.logged: set[str] = set()

    def check(self, route: str, names: Iterable[str]) -> None:
        unknown = sorted(names)
        if unknown and self.strict:
            raise invalid(unknown[0], "unrecognized request argument", "unknown_parameter")
        for name in unknown:
            if name not in self.logged and len(self.logged) < self.MAX_NAMES:
                self.logged.add(name)
                get_logger().info("request_fields_ignored", field=name, route=route)
            if self.count is not None:
                self.count(route, name if name in self.logged else "(other)")

    def wrap(self, route: str, handler: Callable[[Request], Awaitable[Answer]]) -> Callable[[Request], Awaitable[Answer]]:
        """`handler` with this policy bound for `route` while it runs."""
        async def bound(request: Request) -> Answer:
            token = _BOUND.set((self, route))
            try:
                return await handler(request)
            finally:
                _BOUND.reset(token)

        return bound


_BOUND: ContextVar[tuple[UnknownFields, str] | None] = ContextVar("unknown_request_fields", default=None)


def ignore_unknown(names: Iterable[str]) -> None:
    """The current route's unknown (non-null) fields `names`: ignored and reported, or refused under strict
    (outside a route, a request parsed directly: ignored, neither logged nor counted)."""
    bound = _BOUND.get()
    if bound is not None:
        bound[0].check(bound[1], names)


def audit_fields(body: dict[str, Any], kind: str) -> None:
    """Refuse (400) the first field that asks for something this server does not do; unknown ones to
    `ignore_unknown`."""
    unknown = []
    for name, value in body.items():
        if value is None:
            continue
        check = REFUSED.get(name)
        reason = None if check is None else check(value)
        if reason is not None:
            raise invalid(name, reason, "unsupported_parameter")
        if check is None and name not in HONOURED[kind] and name not in MEANINGLESS:
            if name in OTHER_ROUTE[kind]:  # the other route's field: it would change the answer
                other = ROUTE_OF["completion" if kind == "chat" else "chat"]
                raise invalid(name, f"a field of {other}, not of {ROUTE_OF[kind]}", "unsupported_parameter")
            unknown.append(name)
    ignore_unknown(unknown)
