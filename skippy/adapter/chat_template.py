"""Chat messages -> prompt text with llama.cpp's template engine.

The GGUF's own `tokenizer.chat_template` is used when it has one; otherwise llama.cpp's built-in
template for the architecture (the packaged Gemma 3 270M base model carries none: `gemma`; the default
SmolLM2-135M-Instruct carries its ChatML template).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp as L

from skippy.runtime.llama_model import LlamaModel

BUILTIN_BY_ARCH = {"gemma3": "gemma", "llama": "llama3", "qwen2": "chatml", "qwen3": "chatml"}


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


class ChatTemplate:
    def __init__(self, model: LlamaModel, architecture: str) -> None:
        own = L.llama_model_chat_template(model.ptr, None)
        self.source = "gguf" if own else "builtin"
        self.template: bytes = own if own else BUILTIN_BY_ARCH.get(architecture, "chatml").encode()

    def apply(self, messages: list[ChatMessage], add_assistant: bool = True) -> str:
        keep = [(m.role.encode(), m.content.encode()) for m in messages]  # alive during the call
        chat = (L.llama_chat_message * len(keep))(*(L.llama_chat_message(role=r, content=c) for r, c in keep))
        size = 4 * sum(len(c) + len(r) for r, c in keep) + 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_chat_apply_template(self.template, chat, len(keep), add_assistant, buf, size)
            if n < 0:
                raise ValueError("the model's chat template could not be applied to these messages")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n
