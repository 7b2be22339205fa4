"""What the model-free (n-gram) proposers share: an append-only token history that indexes each token
as it is committed, and the factory that makes one such proposer per session from an `NgramConfig`.

A proposer's index is only ever extended: `extend(tokens)` costs O(len(tokens)) index updates, and the
history is never rebuilt (the driver feeds the prompt first, then every committed token, in order).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from skippy.config.speculative import NgramConfig, NgramKind

__all__ = ["NgramHistory", "NgramProposerFactory"]


class NgramHistory(abc.ABC):
    """One session's committed tokens and n-gram bounds; subclasses index token i in `_index(i)` as it
    is appended.  ValueError unless 1 <= min_ngram <= max_ngram (<= max_ngram_limit) and
    max_proposal_tokens >= 1."""

    max_ngram_limit: int | None = None

    def __init__(self, min_ngram: int, max_ngram: int, max_proposal_tokens: int) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram bounds must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}..{max_ngram}")
        limit = self.max_ngram_limit
        if limit is not None and max_ngram > limit:
            raise ValueError(f"max_ngram must be <= {limit}, got {max_ngram}")
        if max_proposal_tokens < 1:
            raise ValueError(f"max_proposal_tokens must be >= 1, got {max_proposal_tokens}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_proposal_tokens = max_proposal_tokens
        self.tokens: list[int] = []

    def extend(self, tokens: Sequence[int]) -> None:
        history = self.tokens
        for token in tokens:
            history.append(int(token))  # plain ints: numpy scalars would make every key slower
            self._index(len(history) - 1)

    @abc.abstractmethod
    def _index(self, i: int) -> None:
        """Add what token i (just appended to `self.tokens`) completes to the index."""

    @abc.abstractmethod
    def _clear_index(self) -> None:
        """Drop the whole index (the history is cleared alongside it)."""

    @abc.abstractmethod
    def propose(self, max_tokens: int) -> list[int]: ...

    def budget(self, max_tokens: int) -> int:
        """How many tokens a proposal may have: min(max_tokens, max_proposal_tokens)."""
        return min(max_tokens, self.max_proposal_tokens)

    def close(self) -> None:
        self.tokens.clear()
        self._clear_index()


class NgramProposerFactory:
    """Makes a fresh proposer per session from one `NgramConfig`; refuses a config of another kind
    (a proposer is never silently swapped for another).  Subclasses set `name`, `kind` and `proposer`."""

    name: str
    kind: NgramKind
    proposer: type[NgramHistory]
    runs_llama = False  # pure Python, microseconds a call: drafted on the event loop

    def __init__(self, config: NgramConfig) -> None:
        if config.kind is not self.kind:
            raise ValueError(f"the {self.name!r} proposer needs ngram.kind = {self.kind.value!r}, got {config.kind.value!r}")
        self.config = config
        self.for_session(-1)  # validates the bounds once, at startup rather than at the first request

    def for_session(self, session_id: int) -> NgramHistory:
        config = self.config
        return self.proposer(config.min_ngram, config.max_ngram, config.max_proposal_tokens)

    def close(self) -> None:
        pass  # nothing shared between sessions
