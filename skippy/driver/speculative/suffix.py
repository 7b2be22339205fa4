"""The n-gram suffix proposer (`ngram.kind = "suffix"`): model-free, per session.

Let h = h[0..n) be the history (prompt + committed tokens) and s = min(min_ngram, 8) the seed length.

- Index: seed → end positions.  For every e with s <= e <= n, `ends[h[e-s:e]]` holds e (ascending);
  committing token h[i] adds exactly one entry (e = i + 1), so `extend` is O(new tokens).
- Lookup: the current seed is h[n-s:n].  For every earlier end e < n with the same seed,
      L(e) = max { l <= min(max_ngram, e) : h[e-l:e] == h[n-l:n] }   (compared backwards from the seed).
- Choice: the longest L(e); among equally long matches the most recent (largest e).  Candidates are
  visited newest first and replaced only by a strictly longer match; a match of max_ngram tokens cannot
  be beaten, so the visit stops there.  Silent (no proposal) if the best L < min_ngram, which can only
  happen when min_ngram > 8.
- Proposal: h[e : e + m] with m = min(max_tokens, max_proposal_tokens, 2·L, n − e): never past the end
  of the history (the continuation may run into the current suffix itself, as in a periodic sequence),
  and no longer than twice the evidence behind it.

A propose() call costs O(#earlier ends of the seed × max_ngram), never a scan of the whole history.
"""

from __future__ import annotations

from skippy.config.speculative import NgramKind
from skippy.driver.speculative.history import NgramHistory, NgramProposerFactory

__all__ = ["MATCH_LENGTH_FACTOR", "MAX_SEED_TOKENS", "SuffixProposer", "SuffixProposerFactory"]

MAX_SEED_TOKENS = 8  # the index key is the last min(min_ngram, 8) tokens
MATCH_LENGTH_FACTOR = 2  # a match of L tokens proposes at most 2·L tokens


class SuffixProposer(NgramHistory):
    """Proposes what followed the longest (then most recent) earlier match of the history's suffix."""

    def __init__(self, min_ngram: int, max_ngram: int, max_proposal_tokens: int) -> None:
        super().__init__(min_ngram, max_ngram, max_proposal_tokens)
        self.seed_tokens = min(min_ngram, MAX_SEED_TOKENS)
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def _index(self, i: int) -> None:
        end = i + 1
        if end >= self.seed_tokens:
            self._ends.setdefault(tuple(self.tokens[end - self.seed_tokens : end]), []).append(end)

    def _clear_index(self) -> None:
        self._ends.clear()

    def match(self) -> tuple[int, int] | None:
        """(end, length) of the chosen earlier match of the history's suffix, or None."""
        history, seed = self.tokens, self.seed_tokens
        n = len(history)
        if n < seed:
            return None
        ends = self._ends.get(tuple(history[n - seed :]), [])
        best_end, best_length = -1, 0
        # ends[-1] == n is the current suffix itself; visit the earlier ones newest first
        for k in range(len(ends) - 2, -1, -1):
            end = ends[k]
            limit = min(self.max_ngram, end)
            length = seed  # the seed is equal by construction of the index
            while length < limit and history[end - 1 - length] == history[n - 1 - length]:
                length += 1
            if length > best_length:  # strict: an equal length never displaces a more recent match
                best_end, best_length = end, length
                if length == self.max_ngram:
                    break
        if best_length < self.min_ngram:
            return None
        return best_end, best_length

    def propose(self, max_tokens: int) -> list[int]:
        return self.propose_matched(max_tokens)[0]

    def propose_matched(self, max_tokens: int) -> tuple[list[int], int]:
        """(proposal, L): the proposal and the length of the match behind it (0 when there is none)."""
        budget = self.budget(max_tokens)
        found = self.match() if budget > 0 else None
        if found is None:
            return [], 0
        end, length = found
        return self.tokens[end : end + min(budget, MATCH_LENGTH_FACTOR * length)], length  # the slice stops at n


class SuffixProposerFactory(NgramProposerFactory):
    """`ngram.kind = "suffix"`: one `SuffixProposer` per session with the config's n-gram bounds."""

    name = "suffix"
    kind = NgramKind.SUFFIX
    proposer = SuffixProposer
