"""The n-gram cache proposer (`ngram.kind = "cache"`): a port of llama.cpp's context n-gram cache
(`common/ngram-cache.{h,cpp}`, `common_ngram_cache_update` + `common_ngram_cache_draft`, as vendored in
llama-cpp-python 0.3.36) with only the context cache: no dynamic (earlier runs) or static (corpus) cache.

Cache: for each n in [min_ngram, max_ngram] (max_ngram <= 4), the n-gram g = h[i-n:i] maps to counts
c_g(t) of the token t = h[i] that followed it, with total N_g = Σ_t c_g(t) and top token t*_g.

- Update: committing token h[i] adds the n-grams ending just before it, h[i-n:i] → h[i] for each n with
  i >= n.  This is `common_ngram_cache_update(cache, min, max, history, nnew)` over the FULL history, so
  n-grams spanning two `extend` calls are counted (the llama.cpp server passes only the new tokens and
  loses them).  O(new tokens × (max_ngram − min_ngram + 1)).
- Draft: greedy, one token at a time over the context x = history + draft so far.  For n from
  max_ngram down to min_ngram (skipping n > len(x)), g = x[-n:] is accepted when
      N_g >= MIN_SAMPLES[n] and 100·c_g(t*_g) >= MIN_PERCENT[n]·N_g   (lax thresholds, below);
  the first accepted n appends t*_g.  Stop when no n is accepted or the budget
  min(max_tokens, max_proposal_tokens) is reached.  No draft at all for a history shorter than 2
  (llama.cpp's `inp_size < LLAMA_NGRAM_STATIC` guard).

Deliberate differences from the C++:
- Top-token ties: C++ takes the first maximum in `unordered_map` iteration order (unspecified).  Here the
  tie goes to the most recently seen token: the top is kept incrementally, and a token whose count
  reaches (or passes) the top count becomes the top.  Among tokens with the top count this is the one
  that occurred last.
- Thresholds are indexed by n (n = 1..4).  C++ indexes them by the position in the n-gram list, i.e.
  n − min_ngram; the two agree for min_ngram = 1, llama.cpp's own `LLAMA_NGRAM_MIN`.
- N-grams that would start before the history are skipped (C++ reads out of range there).
"""

from __future__ import annotations

from skippy.config.speculative import MAX_CACHE_NGRAM, NgramKind
from skippy.driver.speculative.history import NgramHistory, NgramProposerFactory

__all__ = ["MIN_HISTORY_TOKENS", "MIN_PERCENT", "MIN_SAMPLES", "NgramCacheProposer", "NgramCacheProposerFactory"]

# llama.cpp's draft_min_sample_size_lax / draft_min_percent_lax, index n - 1
MIN_SAMPLES: tuple[int, ...] = (2, 2, 1, 1)
MIN_PERCENT: tuple[int, ...] = (66, 50, 50, 50)
MIN_HISTORY_TOKENS = 2  # LLAMA_NGRAM_STATIC


class Followers:
    """c_g: how often each token followed one n-gram g, with the total N_g and the top token t*_g."""

    __slots__ = ("counts", "total", "top", "top_count")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.top = -1
        self.top_count = 0

    def add(self, token: int) -> None:
        count = self.counts.get(token, 0) + 1
        self.counts[token] = count
        self.total += 1
        if count >= self.top_count:  # >=: ties go to the token seen last
            self.top, self.top_count = token, count

    def passes(self, n: int) -> bool:
        """The lax thresholds for an n-gram: N_g >= MIN_SAMPLES[n] and a top share >= MIN_PERCENT[n]%."""
        return self.total >= MIN_SAMPLES[n - 1] and 100 * self.top_count >= MIN_PERCENT[n - 1] * self.total


class NgramCacheProposer(NgramHistory):
    """Drafts greedily from the counts of what followed each of the history's 1..4-grams."""

    max_ngram_limit = MAX_CACHE_NGRAM

    def __init__(self, min_ngram: int, max_ngram: int, max_proposal_tokens: int) -> None:
        super().__init__(min_ngram, max_ngram, max_proposal_tokens)
        # keyed by the n-gram's tokens; tuples of different n never collide
        self._cache: dict[tuple[int, ...], Followers] = {}

    def _index(self, i: int) -> None:
        history, cache = self.tokens, self._cache
        token = history[i]
        for n in range(self.min_ngram, min(self.max_ngram, i) + 1):
            key = tuple(history[i - n : i])
            followers = cache.get(key)
            if followers is None:
                followers = cache[key] = Followers()
            followers.add(token)

    def _clear_index(self) -> None:
        self._cache.clear()

    def followers(self, ngram: tuple[int, ...]) -> Followers | None:
        """What the cache holds for one n-gram (None if it never occurred with a successor)."""
        return self._cache.get(ngram)

    def _next(self, draft: list[int]) -> int | None:
        """The token drafted after history + draft: the longest n-gram that passes, else None."""
        history = self.tokens
        available = len(history) + len(draft)
        for n in range(min(self.max_ngram, available), self.min_ngram - 1, -1):
            if len(draft) >= n:
                key = tuple(draft[len(draft) - n :])
            else:
                key = tuple(history[len(history) - (n - len(draft)) :]) + tuple(draft)
            followers = self._cache.get(key)
            if followers is not None and followers.passes(n):
                return followers.top
        return None

    def propose(self, max_tokens: int) -> list[int]:
        return self.continue_draft([], max_tokens)

    def continue_draft(self, prefix: list[int], max_tokens: int) -> list[int]:
        """Up to max_tokens (and max_proposal_tokens) drafts after history + `prefix` (read-only: a native-MTP
        prefix the composite plan extends, skippy.driver.speculative.native_mtp)."""
        budget = self.budget(max_tokens)
        draft = list(prefix)
        if len(self.tokens) < MIN_HISTORY_TOKENS:
            return []
        while len(draft) - len(prefix) < budget:
            token = self._next(draft)
            if token is None:
                break
            draft.append(token)
        return draft[len(prefix):]


class NgramCacheProposerFactory(NgramProposerFactory):
    """`ngram.kind = "cache"`: one `NgramCacheProposer` per session with the config's n-gram bounds."""

    name = "cache"
    kind = NgramKind.CACHE
    proposer = NgramCacheProposer
