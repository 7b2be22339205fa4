"""OpenAI request bodies -> a validated GenerationRequest (400s name the offending field).

Which fields are honoured, accepted as meaningless or refused is skippy.adapter.request_fields (and the
README's table); messages are skippy.adapter.chat_messages (the chat template renders them, and the tools:
skippy.adapter.chat_template); `response_format` and tools become the sampling grammar in
skippy.adapter.grammar.structured. A grammar excludes `stop` strings (one could cut the structured
output short while reporting `stop`) and `ignore_eos` (a finished grammar allows only end-of-generation).

A sampling field the request does not set gets the model's default (skippy.adapter.sampling_defaults: the
GGUF's `general.sampling.*`, else llama-server's), field by field.
Sampling values outside their range are a 400 naming the field, never rewritten: `temperature` in
[0, 2], `top_p` in [0, 1], `presence_penalty` and `frequency_penalty` in [-2, 2] (OpenAI's ranges);
llama.cpp's extensions `top_k` an integer in [0, 2^31 - 1] (0: off), `min_p` in [0, 1] (0: off) and
`repeat_penalty` > 0 (1: off; llama.cpp divides by it). `top_p` 0 reaches llama.cpp's top-p sampler,
which keeps at least one token: the most likely one, so it is greedy at any temperature. `n` is 1;
`seed` is any integer, taken modulo 2^32 (llama.cpp's uint32 seed; -1, like no seed, is random).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from skippy.adapter.chat_messages import ChatMessage, parse_messages
from skippy.adapter.grammar.structured import build_grammar, response_schema
from skippy.adapter.grammar.tools import ToolPlan, parse_tools
from skippy.adapter.request_fields import audit_fields
from skippy.adapter.sampling_defaults import LLAMA_CPP_SAMPLING, SamplingDefaults
from skippy.http.errors import HttpError, invalid
from skippy.runtime.sampling import DEFAULT_SEED, SamplingParams


@dataclass
class GenerationRequest:
    kind: str  # "chat" | "completion"
    model: str
    prompt_text: str | None = None  # completions
    prompt_ids: list[int] | None = None  # completions given token ids
    suffix: str | None = None  # completions: the text after the insertion (fill-in-the-middle)
    messages: list[ChatMessage] = field(default_factory=list)  # chat
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    progress: bool = False  # return_progress: prompt progress chunks in the stream
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    user: str | None = None
    tools: ToolPlan | None = None  # chat: a call may (auto) or must (forced) be made
    sampling: SamplingParams = field(default_factory=SamplingParams)


INT32_MAX = 2**31 - 1


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _bounds(lo: float | None, hi: float | None, *, above: bool = False) -> str:
    def text(bound: float) -> str:
        return str(bound) if isinstance(bound, int) else f"{bound:g}"

    if hi is None:
        return f"{'>' if above else '>='} {text(lo or 0)}"
    if lo is None:
        return f"<= {text(hi)}"
    return f"in {'(' if above else '['}{text(lo)}, {text(hi)}]"


def _number(body: dict[str, Any], name: str, default: float, lo: float | None = None, hi: float | None = None,
            *, above: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] when `above`), else a 400 naming `name`."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(name, f"expected a number, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the double range
        number = math.inf
    if not math.isfinite(number):
        raise invalid(name, f"expected a finite number, got {_show(value)}")
    if (lo is not None and (number <= lo if above else number < lo)) or (hi is not None and number > hi):
        raise invalid(name, f"must be {_bounds(lo, hi, above=above)}, got {_show(value)}")
    return number


def _integer(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"expected an integer, got {_show(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise invalid(name, f"must be {_bounds(lo, hi)}, got {_show(value)}")
    return value


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(name, f"expected true or false, got {_show(value)}")
    return value


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 4:
        return value
    raise invalid("stop", "expected a string or a list of at most 4 strings")


def _logit_bias(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("logit_bias", "expected a map of token id to bias")
    bias: dict[int, float] = {}
    for key, b in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise invalid("logit_bias", f"token id {key!r} is not an integer") from None
        if isinstance(b, bool) or not isinstance(b, int | float) or not -100 <= b <= 100:
            raise invalid("logit_bias", f"bias for token {_show(token)} must be a number in [-100, 100], got {_show(b)}")
        bias[token] = -math.inf if b <= -100 else float(b)
    return bias


def _prompt(req: GenerationRequest, prompt: Any) -> None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        req.prompt_ids = list(prompt)
        return
    if isinstance(prompt, list):
        raise invalid("prompt", "a list of several prompts needs n choices; send one prompt per request")
    if not isinstance(prompt, str) or not prompt:
        raise invalid("prompt", f"expected a non-empty string or token ids, got {_show(prompt)}")
    req.prompt_text = prompt


def _stream_options(req: GenerationRequest, options: Any) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise invalid("stream_options", "expected an object")
    unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise invalid(f"stream_options.{unknown[0]}", "unknown field")
    req.include_usage = bool(options.get("include_usage", False))


def _suffix(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid("suffix", f"expected a string, got {_show(value)}")
    return value


def parse_generation(body: Any, kind: str, served_model: str,
                     defaults: SamplingDefaults = LLAMA_CPP_SAMPLING) -> GenerationRequest:
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object", code="invalid_value")
    model = body.get("model")
    if not isinstance(model, str):
        raise invalid("model", f"expected a string, got {model!r}")
    if model != served_model:
        raise HttpError(404, f"model {model!r} not found; this server serves {served_model!r}",
                        param="model", code="model_not_found")
    audit_fields(body, kind)
    n = _integer(body, "n", 1, 128)
    if n is not None and n != 1:
        raise invalid("n", "only n = 1 is supported")
    req = GenerationRequest(kind=kind, model=model)
    if kind == "chat":
        req.messages = parse_messages(body.get("messages"))
        req.tools = parse_tools(body)  # shown to the model by the chat template (skippy.adapter.chat_template)
        req.logprobs = _flag(body, "logprobs")
        req.top_logprobs = _integer(body, "top_logprobs", 0, 20) or 0
        if body.get("top_logprobs") is not None and not req.logprobs:
            raise invalid("top_logprobs", "requires logprobs: true")
    else:
        _prompt(req, body.get("prompt"))
        req.suffix = _suffix(body.get("suffix"))
        top = _integer(body, "logprobs", 0, 20)
        req.logprobs, req.top_logprobs = top is not None, top or 0
    req.max_tokens = _integer(body, "max_completion_tokens", 1) or _integer(body, "max_tokens", 1)
    req.stream = _flag(body, "stream")
    req.progress = _flag(body, "return_progress")
    _stream_options(req, body.get("stream_options"))
    req.stop = _stops(body.get("stop"))
    req.ignore_eos = _flag(body, "ignore_eos")
    grammar = build_grammar(response_schema(body.get("response_format")), req.tools)
    if grammar is not None and req.stop:
        raise invalid("stop", "cannot be combined with response_format or tools (a stop string could cut the output)")
    if grammar is not None and req.ignore_eos:
        raise invalid("ignore_eos", "cannot be combined with response_format or tools (a finished grammar allows only EOS)")
    user = body.get("user")
    req.user = user if isinstance(user, str) else None
    seed = _integer(body, "seed")
    req.sampling = SamplingParams(
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", defaults.top_p, 0.0, 1.0),
        top_k=_or(_integer(body, "top_k", 0, INT32_MAX), defaults.top_k),
        min_p=_number(body, "min_p", defaults.min_p, 0.0, 1.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=_number(body, "repeat_penalty", defaults.repeat_penalty, 0.0, above=True),
        seed=DEFAULT_SEED if seed is None else seed & 0xFFFFFFFF,
        logit_bias=_logit_bias(body.get("logit_bias")),
        top_logprobs=req.top_logprobs if req.logprobs else None,
        grammar=grammar,
    )
    return req
