"""llama-server's smaller routes around prompts: /apply-template, /v1/chat/completions/input_tokens, /tokenize.

- `POST /apply-template`: a chat request's body -> `{"prompt": text}`, the text the model is given (its
  chat template, the tools' system prompt included), as llama-server answers.
- `POST /v1/chat/completions/input_tokens`: a chat request's body -> `{"input_tokens": n}`, its token count
  as templated (what `usage.prompt_tokens` would say).
- `POST /tokenize`: llama-server's form `{"content", ...}` (skippy.adapter.tokenize), or vLLM's: `{"prompt",
  "add_special_tokens": true}` or `{"messages", "add_generation_prompt": true, "add_special_tokens": true,
  "tools"}` -> `{"count", "max_model_len", "tokens", "token_strs"}`. (vLLM's messages form defaults
  `add_special_tokens` to false; here it is true, so the count is the chat request's `prompt_tokens`: llama.cpp's
  templates leave BOS to the tokenizer.) Every form takes `model`, which must
  be the served one (else 404, as the generation routes answer).
These read the request with the generation routes' own parser (skippy.adapter.completions.Generation.parse),
so a body they accept is one /v1/chat/completions accepts, and their counts are its counts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from skippy.adapter.completions import Generation
from skippy.adapter.request_fields import ignore_unknown
from skippy.adapter.tokenize import TOKENIZE_KEYS, piece_text, switch, tokenize_content
from skippy.http.errors import HttpError, invalid
from skippy.http.routing import Request, Response, json_response
from skippy.protocol import Status
from skippy.request_events import PipelineUnavailable

VLLM_PROMPT_KEYS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
VLLM_CHAT_KEYS = frozenset({"model", "messages", "add_generation_prompt", "add_special_tokens", "return_token_strs",
                            "tools", "tool_choice"})


def _object(request: Request) -> dict[str, Any]:
    body = request.json()
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object", code="invalid_value")
    return body


def _known(body: dict[str, Any], keys: frozenset[str]) -> None:
    ignore_unknown(set(body) - keys)


class PromptRoutes:
    def __init__(self, generation: Generation, status: Callable[[], Awaitable[Status]]) -> None:
        self.generation = generation
        self.status = status

    def _chat_prompt(self, body: dict[str, Any], add_generation_prompt: bool = True) -> str:
        """The templated text of a chat request's body (`model` optional: the served one)."""
        gen = self.generation
        req = gen.parse({"model": gen.model_id, **body}, "chat")
        return gen.template.apply(req.messages, add_assistant=add_generation_prompt, tools=req.tools)

    async def apply_template(self, request: Request) -> Response:
        return json_response({"prompt": self._chat_prompt(_object(request))})

    async def input_tokens(self, request: Request) -> Response:
        gen = self.generation
        req = gen.parse({"model": gen.model_id, **_object(request)}, "chat")
        return json_response({"input_tokens": len(gen.prompt_ids(req))})

    async def tokenize(self, request: Request) -> Response:
        body = _object(request)
        model = body.get("model")
        if model is not None and model != self.generation.model_id:
            raise HttpError(404, f"model {model!r} not found; this server serves {self.generation.model_id!r}",
                            param="model", code="model_not_found")
        if "content" in body or not ({"prompt", "messages"} & set(body)):
            _known(body, TOKENIZE_KEYS | {"model"})
            return tokenize_content(self.generation.tokenizer, body)
        return await self._tokenize_vllm(body)

    async def _tokenize_vllm(self, body: dict[str, Any]) -> Response:
        tokenizer = self.generation.tokenizer
        if "messages" in body:
            _known(body, VLLM_CHAT_KEYS)
            chat = {k: v for k, v in body.items() if k in ("model", "messages", "tools", "tool_choice")}
            text = self._chat_prompt(chat, switch(body, "add_generation_prompt", True))
            tokens = tokenizer.encode(text, add_special=switch(body, "add_special_tokens", True), parse_special=True)
        else:
            _known(body, VLLM_PROMPT_KEYS)
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise invalid("prompt", f"expected a string, got {type(prompt).__name__}")
            tokens = tokenizer.encode(prompt, add_special=switch(body, "add_special_tokens", True), parse_special=True)
        strs = [piece_text(tokenizer, t) for t in tokens] if switch(body, "return_token_strs", False) else None
        try:
            max_len: int | None = (await self.status()).ctx_size or None
        except PipelineUnavailable:  # the context is unknown while the pipeline is down; the tokens are not
            max_len = None
        return json_response({"count": len(tokens), "max_model_len": max_len, "tokens": tokens, "token_strs": strs})
