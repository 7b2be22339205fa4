"""The context-window rule for a prompt (`prompt_length_error`), shared by adapter, broker and driver."""

from __future__ import annotations

import pytest

from skippy.config import PromptLengthError, prompt_length_error


@pytest.mark.parametrize("n_tokens", [1, 255])
def test_a_prompt_that_leaves_room_for_one_token_fits(n_tokens: int) -> None:
    assert prompt_length_error(n_tokens, 256) is None


@pytest.mark.parametrize("n_tokens", [256, 297])
def test_a_too_long_prompt_is_refused_in_openai_and_anthropic_words(n_tokens: int) -> None:
    error = prompt_length_error(n_tokens, 256)
    assert error == PromptLengthError("context_length_exceeded", n_tokens, 256)
    assert str(error) == error.message == error.openai_message("prompt") == (
        f"This model's maximum context length is 256 tokens. However, your prompt resulted in {n_tokens} tokens"
        " (at most 255, to leave one for the reply). Please reduce the length of the prompt.")
    assert "your messages resulted in" in error.openai_message("messages")
    assert error.anthropic_message() == f"prompt is too long: {n_tokens} tokens > 255 maximum"


def test_an_empty_prompt_is_a_bad_request() -> None:
    error = prompt_length_error(0, 256)
    assert error is not None and error.code == "bad_request"
    assert error.openai_message("prompt") == "prompt: empty; a prompt must have 1..255 tokens (ctx_size 256)"
