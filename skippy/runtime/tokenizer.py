"""Tokenizer from llama.cpp's vocabulary: text to token ids, and ids back to text UTF-8 safely."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as L

from skippy.runtime.llama_model import LlamaModel


class Tokenizer:
    """Wraps a model's vocabulary; loads a vocab-only model when given a path."""

    def __init__(self, model: LlamaModel | Path) -> None:
        self._owned = not isinstance(model, LlamaModel)
        self.model = LlamaModel(model, vocab_only=True) if isinstance(model, Path) else model
        self.vocab = self.model.vocab
        self.n_vocab = self.model.n_vocab

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = (L.llama_token * capacity)()
            n = L.llama_tokenize(self.vocab, data, len(data), out, capacity, add_special, parse_special)
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def piece(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def decode(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def eog_tokens(self) -> frozenset[int]:
        return frozenset(t for t in (L.llama_vocab_eos(self.vocab), L.llama_vocab_eot(self.vocab)) if t >= 0)

    def close(self) -> None:
        if self._owned:
            self.model.close()


class IncrementalDecoder:
    """Turns a token stream into text deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending = b""

    def push(self, token: int) -> str:
        self._pending += self._tokenizer.piece(token)
        # hold back at most an incomplete trailing character (<= 3 bytes); anything else is invalid
        for cut in range(len(self._pending), max(len(self._pending) - 4, 0), -1):
            try:
                text = self._pending[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            self._pending = self._pending[cut:]
            return text
        if len(self._pending) < 4:
            return ""
        return self.flush()

    def flush(self) -> str:
        text, self._pending = self._pending.decode("utf-8", "replace"), b""
        return text
