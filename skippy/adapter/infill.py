"""Fill-in-the-middle: `POST /infill` (llama-server's) and `/v1/completions` with `suffix`.

Only a model whose vocabulary has FIM prefix, suffix and middle tokens can fill in (llama.cpp finds them
from `tokenizer.ggml.fim_pre_token_id` etc. or by their text); any other model answers 400 naming the
missing ones. The prompt is llama-server's (`format_prompt_infill`, its repo-level pattern): the
`input_extra` chunks first (each after a FIM separator token and its file name, when the model has
one), then `[FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]`, and the model writes the middle.
/infill's body: `input_prefix`, `input_suffix` (both required strings), `input_extra`
(`[{"text", "filename"}]`), `prompt` (text after the prefix), `n_predict` (or `max_tokens`), sampling
fields and `stream`, `stop`, `seed`; it answers in llama-server's native shape (`content`, `stop`,
`tokens_predicted`, `tokens_evaluated`; streamed: one `{"content", "stop"}` event per piece, no [DONE]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp as L

from skippy.adapter.request_fields import ignore_unknown
from skippy.http.errors import HttpError, invalid
from skippy.runtime.tokenizer import Tokenizer

INFILL_FIELDS = frozenset({"input_prefix", "input_suffix", "input_extra", "prompt", "model"})
PASSED_ON = frozenset({"max_tokens", "stream", "stop", "seed", "temperature", "top_p", "top_k", "min_p",
                       "presence_penalty", "frequency_penalty", "repeat_penalty", "ignore_eos", "logit_bias"})


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int  # -1: none
    sep: int  # -1: none

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> FimTokens:
        v = tokenizer.vocab
        return cls(L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v),
                   L.llama_vocab_fim_rep(v), L.llama_vocab_fim_sep(v))

    def missing(self) -> list[str]:
        return [name for name, token in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid)) if token < 0]

    def require(self, param: str) -> None:
        """A 400 naming `param` unless the model can fill in the middle."""
        missing = self.missing()
        if missing:
            raise HttpError(400, f"{param}: this model has no fill-in-the-middle tokens (its GGUF declares no FIM"
                                 f" {', '.join(missing)} token); infill is not supported", param=param,
                            code="infill_unsupported")


def fim_prompt(tokenizer: Tokenizer, fim: FimTokens, prefix: str, suffix: str, prompt: str = "",
               extra: Sequence[tuple[str, str]] = ()) -> list[int]:
    """llama-server's infill prompt: extra chunks, then [PRE] prefix prompt [SUF] suffix [MID]."""
    def text(s: str) -> list[int]:
        return tokenizer.encode(s, add_special=False, parse_special=False)

    head: list[int] = [fim.rep, *text("myproject\n")] if fim.rep >= 0 else []
    for filename, chunk in extra:
        head += [fim.sep, *text(filename + "\n")] if fim.sep >= 0 else text("\n\n--- snippet ---\n\n")
        head += text(chunk)
    if fim.sep >= 0:
        head += [fim.sep, *text("filename\n")]
    bos = [int(L.llama_vocab_bos(tokenizer.vocab))] if L.llama_vocab_get_add_bos(tokenizer.vocab) else []
    return [*head, *bos, fim.pre, *text(prefix), *text(prompt), fim.suf, *text(suffix), fim.mid]


def _string(body: dict[str, Any], name: str, required: bool) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise invalid(name, "is required (a string)" if value is None else f"expected a string, got {type(value).__name__}")
    return value


def _extra(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("input_extra", 'expected a list of {"filename": string, "text": string}')
    chunks = []
    for i, chunk in enumerate(value):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise invalid(f"input_extra[{i}].text", "expected a string")
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise invalid(f"input_extra[{i}].filename", "expected a string")
        chunks.append((filename, chunk["text"]))
    return chunks


def infill_completion(body: Any, tokenizer: Tokenizer, fim: FimTokens, model_id: str) -> dict[str, Any]:
    """An /infill body -> the /v1/completions body (prompt as token ids) that generates its middle."""
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object", code="invalid_value")
    fim.require("input_prefix")
    ignore_unknown(set(body) - INFILL_FIELDS - PASSED_ON - {"n_predict"})
    ids = fim_prompt(tokenizer, fim, _string(body, "input_prefix", True), _string(body, "input_suffix", True),
                     _string(body, "prompt", False), _extra(body.get("input_extra")))
    completion = {name: body[name] for name in PASSED_ON if name in body}
    n_predict = body.get("n_predict")
    if n_predict is not None and n_predict != -1:
        completion["max_tokens"] = n_predict
    return {**completion, "model": model_id, "prompt": ids}
