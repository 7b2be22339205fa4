"""`POST /tokenize` and `POST /detokenize` in llama-server's shapes.

/tokenize: `{"content": str, "add_special": false, "parse_special": true, "with_pieces": false}` ->
`{"tokens": [ids]}`, or with pieces `{"tokens": [{"id": 1, "piece": "text"}]}` (a piece that is not
valid UTF-8 is a list of its bytes). /detokenize: `{"tokens": [ids]}` -> `{"content": str}` (special
tokens rendered as their text, as llama-server does). Ids outside the vocabulary are a 400.
/tokenize's route (with `model` and vLLM's forms) is skippy.adapter.prompt_routes; `tokenize_content` is its
llama-server form.
"""

from __future__ import annotations

from typing import Any

from skippy.adapter.request_fields import ignore_unknown
from skippy.http.errors import HttpError, invalid
from skippy.http.routing import Request, Response, json_response
from skippy.runtime.tokenizer import Tokenizer

TOKENIZE_KEYS = frozenset({"content", "add_special", "parse_special", "with_pieces"})


def _object(request: Request, keys: set[str]) -> dict[str, Any]:
    body = request.json()
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object", code="invalid_value")
    ignore_unknown(set(body) - keys)
    return body


def switch(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise invalid(name, f"expected true or false, got {value!r}")
    return value


def piece_text(tokenizer: Tokenizer, token: int) -> str | list[int]:
    data = tokenizer.piece(token, special=True)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def tokenize_content(tokenizer: Tokenizer, body: dict[str, Any]) -> Response:
    """llama-server's /tokenize form (its keys already checked)."""
    content = body.get("content")
    if not isinstance(content, str):
        raise invalid("content", f"expected a string, got {type(content).__name__}")
    tokens = tokenizer.encode(content, add_special=switch(body, "add_special", False),
                              parse_special=switch(body, "parse_special", True))
    if switch(body, "with_pieces", False):
        return json_response({"tokens": [{"id": t, "piece": piece_text(tokenizer, t)} for t in tokens]})
    return json_response({"tokens": tokens})


def check_tokens(tokenizer: Tokenizer, tokens: Any, param: str) -> list[int]:
    """A list of token ids inside the vocabulary, else a 400 naming `param`."""
    if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
        raise invalid(param, "expected a list of token ids")
    bad = [t for t in tokens if not 0 <= t < tokenizer.n_vocab]
    if bad:
        raise invalid(param, f"token id {bad[0]} is outside the vocabulary (0..{tokenizer.n_vocab - 1})")
    return tokens


def detokenize(tokenizer: Tokenizer, request: Request) -> Response:
    body = _object(request, {"tokens"})
    tokens = check_tokens(tokenizer, body.get("tokens", []), "tokens")
    content = b"".join(tokenizer.piece(t, special=True) for t in tokens).decode("utf-8", "replace")
    return json_response({"content": content})
