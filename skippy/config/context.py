"""The context-window rule for a prompt, written once for every layer that checks it.

A stage's ``ctx_size`` bounds each session: a prompt needs at least one token and must leave room
for one generated token, so it fits when ``1 <= n_tokens < ctx_size``.  The adapter (before it
submits), the broker (before it queues) and stage 0's driver (before it schedules) all ask
:func:`prompt_length_error`, so they refuse the same prompts with the same message.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PromptLengthError", "prompt_length_error"]


@dataclass(frozen=True)
class PromptLengthError:
    """Why a prompt does not fit; ``code`` is the wire's error code (``ErrorCode`` value)."""

    code: str  # "bad_request" for an empty prompt, else "context_length_exceeded"
    message: str

    def __str__(self) -> str:
        return self.message


def prompt_length_error(n_tokens: int, ctx_size: int) -> PromptLengthError | None:
    """None when a prompt of ``n_tokens`` fits a ``ctx_size`` context, else why it does not."""
    if 0 < n_tokens < ctx_size:
        return None
    return PromptLengthError(
        "context_length_exceeded" if n_tokens else "bad_request",
        f"prompt of {n_tokens} tokens must have 1..{ctx_size - 1} tokens (ctx_size {ctx_size})",
    )
