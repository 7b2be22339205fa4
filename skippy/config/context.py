"""The context-window rule for a prompt, written once for every layer that checks it.

A stage's ``ctx_size`` bounds each session: a prompt needs at least one token and must leave room
for one generated token, so it fits when ``1 <= n_tokens < ctx_size``.  The adapter (before it
submits), the broker (before it queues) and stage 0's driver (before it schedules) all ask
:func:`prompt_length_error`, so they refuse the same prompts with the same message: OpenAI's wording
(``openai_message``, naming the limit and the prompt's tokens); the Anthropic Messages API words it as
Anthropic does (``anthropic_message``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PromptLengthError", "prompt_length_error"]


@dataclass(frozen=True)
class PromptLengthError:
    """Why a prompt does not fit; ``code`` is the wire's error code (``ErrorCode`` value)."""

    code: str  # "bad_request" for an empty prompt, else "context_length_exceeded"
    n_tokens: int
    ctx_size: int

    @property
    def message(self) -> str:
        return self.openai_message()

    def openai_message(self, what: str = "prompt") -> str:
        """The message OpenAI gives, for a request whose prompt is its `what` (messages, prompt, input)."""
        if not self.n_tokens:
            return f"{what}: empty; a prompt must have 1..{self.ctx_size - 1} tokens (ctx_size {self.ctx_size})"
        return (f"This model's maximum context length is {self.ctx_size} tokens. However, your {what} resulted in"
                f" {self.n_tokens} tokens (at most {self.ctx_size - 1}, to leave one for the reply)."
                f" Please reduce the length of the {what}.")

    def anthropic_message(self) -> str:
        """Anthropic's words, which Claude Code reads as its cue to compact the conversation."""
        return f"prompt is too long: {self.n_tokens} tokens > {self.ctx_size - 1} maximum"

    def __str__(self) -> str:
        return self.message


def prompt_length_error(n_tokens: int, ctx_size: int) -> PromptLengthError | None:
    """None when a prompt of ``n_tokens`` fits a ``ctx_size`` context, else why it does not."""
    if 0 < n_tokens < ctx_size:
        return None
    return PromptLengthError("context_length_exceeded" if n_tokens else "bad_request", n_tokens, ctx_size)
