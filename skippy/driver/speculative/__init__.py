"""Speculative decoding at stage 0: proposers draft tokens per session, a window policy sizes each verify
window, and the final stage verifies the window row by row (see skippy.stage.final_sampling).

- `setup.py`: which proposer and which window policy stage 0 runs, from its options; start here.
- `engine.py`: the per-session engine: a proposer and window statistics per session, one policy for all.
- `window.py`: `WindowStats` and the window policies (fixed, grow/shrink); `policy.py`: the default policy,
  k and pipeline depth per session from measured acceptance, load and the calibrated cost of rows;
  `metrics.py`: the policy's live state on stage 0's /metrics.
- Proposers: `suffix.py` (the n-gram suffix proposer, per session) with `global_suffix.py` (a bounded suffix
  index across recent sessions), `ngram_cache.py` (llama.cpp's context n-gram cache), `history.py` (what the
  n-gram proposers share: the indexed history, the factory), `draft_model.py` (a small GGUF drafting for every
  session) and `native_mtp.py` (the drafts the final stage's NextN block returned).

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
