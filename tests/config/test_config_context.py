"""The context-window rule for a prompt (`prompt_length_error`), shared by adapter, broker and driver."""

from __future__ import annotations

import pytest

from skippy.config import PromptLengthError, prompt_length_error


@pytest.mark.parametrize("n_tokens", [1, 255])
def test_a_prompt_that_leaves_room_for_one_token_fits(n_tokens: int) -> None:
    assert prompt_length_error(n_tokens, 256) is None


@pytest.mark.parametrize(
    ("n_tokens", "code"), [(0, "bad_request"), (256, "context_length_exceeded"), (297, "context_length_exceeded")]
)
def test_an_empty_or_too_long_prompt_is_refused_with_one_message(n_tokens: int, code: str) -> None:
    error = prompt_length_error(n_tokens, 256)
    assert error == PromptLengthError(code, f"prompt of {n_tokens} tokens must have 1..255 tokens (ctx_size 256)")
    assert str(error) == error.message
