"""OpenAI request bodies -> a validated GenerationRequest (400s name the offending field).

Honoured: model (exact id), messages / prompt, stream, stream_options.include_usage, max_tokens and
max_completion_tokens (the latter wins), temperature, top_p, top_k, min_p, presence_penalty,
frequency_penalty, repeat_penalty, seed, stop, logit_bias, logprobs + top_logprobs, n (only 1),
user, and llama.cpp's ignore_eos. Unknown fields are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from skippy.http.chat_template import ChatMessage
from skippy.http.errors import HttpError
from skippy.runtime.sampling import DEFAULT_SEED, SamplingParams


@dataclass
class GenerationRequest:
    kind: str  # "chat" | "completion"
    model: str
    prompt_text: str | None = None  # completions
    messages: list[ChatMessage] = field(default_factory=list)  # chat
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    user: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)


def _bad(param: str, message: str) -> HttpError:
    return HttpError(400, f"{param}: {message}", param=param, code="invalid_value")


def _number(body: dict[str, Any], name: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(name, f"expected a number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _bad(name, f"must be in [{lo}, {hi}], got {value}")
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"expected an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _bad(name, f"must be in [{lo}, {hi}], got {value}")
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, f"expected true or false, got {value!r}")
    return value


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 4:
        return value
    raise _bad("stop", "expected a string or a list of at most 4 strings")


def _logit_bias(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad("logit_bias", "expected a map of token id to bias")
    bias: dict[int, float] = {}
    for key, b in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise _bad("logit_bias", f"token id {key!r} is not an integer") from None
        if isinstance(b, bool) or not isinstance(b, int | float) or not -100 <= b <= 100:
            raise _bad("logit_bias", f"bias for token {token} must be a number in [-100, 100], got {b!r}")
        bias[token] = -math.inf if b <= -100 else float(b)
    return bias


def _content(message: Any, index: int) -> ChatMessage:
    if not isinstance(message, dict):
        raise _bad(f"messages[{index}]", "expected an object with role and content")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise _bad(f"messages[{index}].role", f"expected a string, got {role!r}")
    if isinstance(content, list):  # content parts: only text is supported
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{index}].content", "only text content parts are supported")
            texts.append(part["text"])
        content = "".join(texts)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise _bad(f"messages[{index}].content", f"expected a string or text parts, got {type(content).__name__}")
    return ChatMessage(role, content)


def parse_generation(body: Any, kind: str, served_model: str) -> GenerationRequest:
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object", code="invalid_value")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("model", f"expected a string, got {model!r}")
    if model != served_model:
        raise HttpError(404, f"model {model!r} not found; this server serves {served_model!r}",
                        param="model", code="model_not_found")
    n = _integer(body, "n", 1, 128)
    if n is not None and n != 1:
        raise _bad("n", "only n = 1 is supported")
    req = GenerationRequest(kind=kind, model=model)
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages", "expected a non-empty list of messages")
        req.messages = [_content(m, i) for i, m in enumerate(messages)]
        req.logprobs = _flag(body, "logprobs")
        req.top_logprobs = _integer(body, "top_logprobs", 0, 20) or 0
        if body.get("top_logprobs") is not None and not req.logprobs:
            raise _bad("top_logprobs", "requires logprobs: true")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            raise _bad("prompt", "a list of several prompts needs n choices; send one prompt per request")
        if not isinstance(prompt, str) or not prompt:
            raise _bad("prompt", f"expected a non-empty string, got {prompt!r}")
        req.prompt_text = prompt
        top = _integer(body, "logprobs", 0, 20)
        req.logprobs, req.top_logprobs = top is not None, top or 0
    req.max_tokens = _integer(body, "max_completion_tokens", 1) or _integer(body, "max_tokens", 1)
    req.stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("stream_options", "expected an object")
        req.include_usage = bool(options.get("include_usage", False))
    req.stop = _stops(body.get("stop"))
    req.ignore_eos = _flag(body, "ignore_eos")
    user = body.get("user")
    req.user = user if isinstance(user, str) else None
    seed = _integer(body, "seed")
    req.sampling = SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1.0,
        top_k=_integer(body, "top_k", 0) or 0,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=_number(body, "repeat_penalty", 1.0, 0.0) or 1.0,
        seed=DEFAULT_SEED if seed is None else seed & 0xFFFFFFFF,
        logit_bias=_logit_bias(body.get("logit_bias")),
        top_logprobs=req.top_logprobs if req.logprobs else None,
    )
    return req
