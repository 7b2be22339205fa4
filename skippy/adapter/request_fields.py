"""Every request field of /v1/chat/completions and /v1/completions is honoured, accepted as meaningless
here, or refused with a 400 naming it; a field OpenAI does not define is refused too (as OpenAI does).

The README's "Request fields" table is this module in prose; keep them together. A field sent as
null counts as not sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skippy.http.errors import invalid

COMMON = frozenset({"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop",
                    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "n", "response_format",
                    # llama.cpp's extensions
                    "top_k", "min_p", "repeat_penalty", "ignore_eos", "return_progress"})
HONOURED = {
    "chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                      "parallel_tool_calls", "modalities"},
    "completion": COMMON | {"prompt", "best_of", "echo", "suffix"},
}
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


def audit_fields(body: dict[str, Any], kind: str) -> None:
    """Refuse (400) the first field that is unknown or asks for something this server does not do."""
    for name, value in body.items():
        if value is None:
            continue
        check = REFUSED.get(name)
        reason = None if check is None else check(value)
        if reason is not None:
            raise invalid(name, reason, "unsupported_parameter")
        if check is None and name not in HONOURED[kind] and name not in MEANINGLESS:
            raise invalid(name, "unrecognized request argument", "unknown_parameter")
