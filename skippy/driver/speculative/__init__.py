"""Speculative decoding at stage 0: proposers draft tokens per session, a window policy sizes each verify
window, and the final stage verifies the window row by row (see skippy.stage.final_sampling).

Interfaces every piece implements:
- `Proposer`: one session's draft source. `extend(tokens)` appends committed tokens to its history
  (the prompt first, then every committed token, in order); `propose(k)` returns up to k draft tokens
  continuing the history (may be fewer, or none); `close()` frees what it holds.
- `ProposerFactory`: makes a session's Proposer (`for_session`) and owns shared state (a draft model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Proposer(Protocol):
    def extend(self, tokens: Sequence[int]) -> None: ...
    def propose(self, max_tokens: int) -> list[int]: ...
    def close(self) -> None: ...


class ProposerFactory(Protocol):
    name: str  # "suffix", "cache", "draft-model" (reported in stats and logs)
    runs_llama: bool  # its proposers call llama.cpp: the driver drafts in the runtime thread

    def for_session(self, session_id: int) -> Proposer: ...
    def close(self) -> None: ...
