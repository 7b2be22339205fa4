"""Chat messages (and the tools in play) -> prompt text, with the model's own chat template.

A GGUF that carries `tokenizer.chat_template` has it rendered with Jinja (skippy.adapter.jinja_template), as
transformers and vLLM render it; one that carries none (the packaged Gemma 3 270M base model) gets llama.cpp's
built-in template for its architecture, as does a template Jinja cannot compile (logged).

Tools: a template that handles them (it reads `tools`, and its calls are `<tool_call>` blocks, the format
skippy.adapter.grammar.tools parses and constrains) is given the tools, the assistant's tool calls and the tool
results as they are. Any other template is given skippy's own tools prompt (skippy.adapter.grammar.tools) in the
system message and the tool turns written as text (skippy.adapter.chat_messages.flat_messages).
OpenAI's `developer` role is rendered as `system` (chat templates know no other). A BOS the template writes
is left out of the text when the tokenizer adds one itself, so the prompt has one.
"""

from __future__ import annotations

import ctypes
from typing import Any

import jinja2
import llama_cpp as L

from skippy.adapter.chat_messages import ChatMessage, flat_messages, with_system
from skippy.adapter.grammar.tools import OPEN, ToolPlan, tools_prompt
from skippy.adapter.jinja_template import JinjaTemplate, TemplateRefused
from skippy.http.errors import invalid
from skippy.log import get_logger
from skippy.runtime.llama_model import LlamaModel
from skippy.runtime.tokenizer import Tokenizer

BUILTIN_BY_ARCH = {"gemma3": "gemma", "llama": "llama3", "qwen2": "chatml", "qwen3": "chatml"}

__all__ = ["BUILTIN_BY_ARCH", "ChatMessage", "ChatTemplate"]


def _token_text(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""


def _openai_message(msg: ChatMessage) -> dict[str, Any]:
    """A message in the shape transformers gives chat templates."""
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in msg.tool_calls]
    if msg.role == "tool":
        out["tool_call_id"] = msg.tool_call_id
        if msg.name is not None:
            out["name"] = msg.name
    return out


def _tool_schemas(plan: ToolPlan) -> list[dict[str, Any]]:
    """The tools a call may use, as the request gave them (OpenAI's function tool shape)."""
    return [{"type": "function", "function": {"name": t.name, **({"description": t.description} if t.description else {}),
                                              "parameters": t.parameters}} for t in plan.tools]


class ChatTemplate:
    def __init__(self, model: LlamaModel, architecture: str) -> None:
        own = L.llama_model_chat_template(model.ptr, None)
        self.source = "gguf" if own else "builtin"
        self.template: bytes = own if own else BUILTIN_BY_ARCH.get(architecture, "chatml").encode()
        tokenizer = Tokenizer(model)
        bos = _token_text(tokenizer, L.llama_vocab_bos(model.vocab))
        self._leading_bos = bos if bos and L.llama_vocab_get_add_bos(model.vocab) else ""
        self.jinja: JinjaTemplate | None = None
        if own:
            try:
                self.jinja = JinjaTemplate(own.decode("utf-8", "replace"), bos,
                                           _token_text(tokenizer, L.llama_vocab_eos(model.vocab)))
            except jinja2.TemplateSyntaxError as exc:
                get_logger().warning("chat_template_not_jinja", error=str(exc), fallback="llama.cpp's template matcher")
        self.native_tools = (self.jinja is not None and "tools" in self.jinja.variables
                             and OPEN.strip() in self.jinja.source)

    @property
    def engine(self) -> str:
        return "jinja" if self.jinja is not None else "llama.cpp"

    def apply(self, messages: list[ChatMessage], add_assistant: bool = True, tools: ToolPlan | None = None) -> str:
        """The prompt for `messages` with `tools` in play (None: no call may be made); a template that raises on
        them is a 400 naming `messages`."""
        messages = [ChatMessage("system", m.content) if m.role == "developer" else m for m in messages]
        if not self.native_tools:
            messages = flat_messages(messages)
            if tools is not None:
                messages = with_system(messages, tools_prompt(tools))
            tools = None
        if self.jinja is None:
            return self._llama_cpp(messages, add_assistant)
        try:
            text = self.jinja.render([_openai_message(m) for m in messages],
                                     _tool_schemas(tools) if tools is not None else None, add_assistant)
        except TemplateRefused as exc:
            raise invalid("messages", f"the model's chat template refused these messages: {exc}") from None
        return text.removeprefix(self._leading_bos) if self._leading_bos else text

    def _llama_cpp(self, messages: list[ChatMessage], add_assistant: bool) -> str:
        keep = [(m.role.encode(), m.content.encode()) for m in messages]  # alive during the call
        chat = (L.llama_chat_message * len(keep))(*(L.llama_chat_message(role=r, content=c) for r, c in keep))
        size = 4 * sum(len(c) + len(r) for r, c in keep) + 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_chat_apply_template(self.template, chat, len(keep), add_assistant, buf, size)
            if n < 0:
                raise invalid("messages", "the model's chat template could not be applied to these messages")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n
