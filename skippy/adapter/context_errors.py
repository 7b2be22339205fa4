"""A prompt that does not fit the context, as each API says it.

OpenAI's routes (chat, completions, infill, Responses) answer a 400 with `code` `context_length_exceeded` and
OpenAI's message naming the context and the prompt's tokens (`PromptTooLong`); the Anthropic Messages API words
it as Anthropic does, "prompt is too long: N tokens > M maximum" (skippy.adapter.agents.anthropic_api), which
Claude Code answers by compacting the conversation. An empty prompt is a plain 400 naming the field.
"""

from __future__ import annotations

from skippy.config import PromptLengthError
from skippy.http.errors import HttpError

__all__ = ["PromptTooLong", "prompt_error"]


class PromptTooLong(HttpError):
    """A 400 `context_length_exceeded`; `unfit` says by how much, for an API that words it otherwise."""

    def __init__(self, unfit: PromptLengthError, param: str) -> None:
        super().__init__(400, unfit.openai_message(param), param=param, code=unfit.code)
        self.unfit = unfit


def prompt_error(unfit: PromptLengthError, param: str) -> HttpError:
    """The error for a prompt (request field `param`) that does not fit."""
    if unfit.n_tokens:
        return PromptTooLong(unfit, param)
    return HttpError(400, unfit.openai_message(param), param=param, code=unfit.code)
