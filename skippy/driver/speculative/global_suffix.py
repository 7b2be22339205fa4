"""Drafting across requests: a bounded suffix index at stage 0 over the prompts and outputs of recent
sessions, consulted with a session's own suffix match, the longer match proposing (SuffixDecoding's global tree, the
`suffix` method of vLLM, kept as seed -> occurrences rather than a tree).

Store: whole finished sessions (prompt + committed tokens; queued by `submit` from the thread that releases
them, added by the next lookup in the drafting thread) end to end in one flat token list, oldest evicted
first, so the tokens held never exceed `max_tokens` (`--openai-speculative-global-tokens`; a session
longer than that keeps its tail). Index: hash of a seed (s = min(min_ngram, 8) tokens) -> the global
end positions of it, ascending; evicted positions are skipped, and the index is rebuilt from the
sessions held once it holds more than twice their entries (measured, random tokens: 14 MB for 65536
tokens held, 26 MB at most before a rebuild; a lookup ~50 µs).

Lookup for a history h of n tokens: the occurrences of h's seed (newest `MAX_CANDIDATES` of them), each
matched backwards against h up to max_ngram tokens; those with the longest match L (>= min_ngram)
are the candidates. Drafting walks them token by token: the next token of each candidate that has one
votes; the top token is proposed only while it holds a strict majority of the votes (per-candidate
counts: where the recent sessions diverge, a low-confidence branch is not proposed), and the candidates
that disagree drop out. At most min(max_tokens, max_proposal_tokens, 2·L) tokens, as the own-history
proposer (skippy.driver.speculative.suffix).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, deque
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from skippy.config.speculative import NgramConfig
from skippy.driver.speculative.suffix import MATCH_LENGTH_FACTOR, MAX_SEED_TOKENS, SuffixProposer, SuffixProposerFactory
from skippy.telemetry.process import current

__all__ = ["CrossRequestProposer", "GlobalSuffixIndex", "GlobalSuffixProposerFactory", "MAX_CANDIDATES"]

MAX_CANDIDATES = 64  # occurrences of a seed examined per lookup, newest first


class GlobalSuffixIndex:
    def __init__(self, max_tokens: int, ngram: NgramConfig) -> None:
        if max_tokens < 0:
            raise ValueError(f"global suffix index size must be >= 0 tokens, got {max_tokens}")
        self.max_tokens = max_tokens
        self.min_ngram, self.max_ngram = ngram.min_ngram, ngram.max_ngram
        self.max_proposal_tokens = ngram.max_proposal_tokens
        self.seed_tokens = min(ngram.min_ngram, MAX_SEED_TOKENS)
        # the sessions held, end to end: flat[i] is the token at global position base + i
        self.flat: list[int] = []
        self.base = 0
        self.starts: list[int] = []  # each session held: its first and one-past-last global position
        self.ends: list[int] = []
        self._ends: dict[int, list[int]] = {}  # hash(seed) -> global ends of it, ascending (evicted ones lazily)
        self._entries = 0  # in _ends, evicted included; rebuilt when they are more than twice the live ones
        self.pending: deque[list[int]] = deque()  # finished sessions not yet added (see `submit`)
        self.registry = CollectorRegistry(auto_describe=True)
        self.proposals = PromCounter("skippy_speculative_global_proposals", "drafts proposed from other sessions'"
                                     " tokens (the global suffix index)", registry=self.registry)
        self.proposed_tokens = PromCounter("skippy_speculative_global_proposed_tokens", "draft tokens proposed from"
                                           " the global suffix index", registry=self.registry)
        for name, doc, read in (
                ("skippy_speculative_global_tokens", "tokens held by the global suffix index", lambda: self.tokens_held),
                ("skippy_speculative_global_tokens_limit", "tokens the global suffix index holds at most"
                 " (--openai-speculative-global-tokens)", lambda: self.max_tokens),
                ("skippy_speculative_global_sessions", "sessions held by the global suffix index",
                 lambda: len(self.starts))):
            Gauge(name, doc, registry=self.registry).set_function(read)
        current().attach(self.registry)

    @property
    def tokens_held(self) -> int:
        return len(self.flat)

    def submit(self, tokens: Sequence[int]) -> None:
        """A finished session's tokens, from any thread (sessions are released in the runtime thread while
        the loop drafts): queued, and added by the next `propose` in the drafting thread."""
        if self.max_tokens:
            self.pending.append(list(tokens))  # deque.append is atomic

    def add(self, tokens: Sequence[int]) -> None:
        """A finished session's prompt + committed tokens (its tail when longer than the index holds); only
        in the thread that proposes."""
        kept = [int(t) for t in tokens[max(0, len(tokens) - self.max_tokens):]] if self.max_tokens else []
        if len(kept) <= self.seed_tokens:
            return
        while self.flat and len(self.flat) + len(kept) > self.max_tokens:  # evict the oldest sessions
            count = self.ends.pop(0) - self.starts.pop(0)
            del self.flat[:count]
            self.base += count
        start = self.base + len(self.flat)
        self.starts.append(start)
        self.ends.append(start + len(kept))
        self.flat.extend(kept)
        self._index(start, kept)
        if self._entries > 2 * len(self.flat) + 1024:
            self._rebuild()

    def _index(self, start: int, kept: list[int]) -> None:
        s = self.seed_tokens
        for end in range(s, len(kept) + 1):
            self._ends.setdefault(hash(tuple(kept[end - s : end])), []).append(start + end)
        self._entries += len(kept) - s + 1

    def _rebuild(self) -> None:
        """Drop the evicted sessions' entries: index the sessions held again (O(tokens held))."""
        self._ends.clear()
        self._entries = 0
        for start, end in zip(self.starts, self.ends):
            self._index(start, self.flat[start - self.base : end - self.base])

    def _candidates(self, history: Sequence[int]) -> tuple[list[tuple[int, int]], int]:
        """(end, session end) of the longest matches of the history's suffix, as indices into `flat`, and
        their length L."""
        n, s = len(history), self.seed_tokens
        entries = self._ends.get(hash(tuple(history[n - s :]))) if n >= s else None
        best: list[tuple[int, int]] = []
        best_length = 0
        flat, base = self.flat, self.base
        for end in itertools.islice(reversed(entries or ()), MAX_CANDIDATES):
            if end - s < base:
                break  # this one and all older ones were evicted
            session = bisect.bisect_right(self.starts, end - 1) - 1
            at, limit = end - base, min(self.max_ngram, end - self.starts[session], n)
            length = 0
            while length < limit and flat[at - 1 - length] == history[n - 1 - length]:
                length += 1
            if length < s:
                continue  # a hash collision, not the seed
            if length > best_length:
                best, best_length = [], length
            if length == best_length:
                best.append((at, self.ends[session] - base))
        return (best, best_length) if best_length >= self.min_ngram else ([], 0)

    def propose(self, history: Sequence[int], max_tokens: int) -> list[int]:
        """Up to max_tokens tokens continuing `history` as earlier sessions did (module docstring)."""
        draft = self.propose_matched(history, max_tokens)[0]
        self.count(draft)
        return draft

    def count(self, draft: Sequence[int]) -> None:
        """A proposal from the index was used: the metrics count it."""
        if draft:
            self.proposals.inc()
            self.proposed_tokens.inc(len(draft))

    def propose_matched(self, history: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """(proposal, L): `propose`'s proposal and the length of the match behind it (0 when none); not counted
        (the caller may prefer another proposal: `count` the one used)."""
        while self.pending:
            self.add(self.pending.popleft())
        alive, length = self._candidates(history)
        budget = min(max_tokens, self.max_proposal_tokens, MATCH_LENGTH_FACTOR * length)
        flat = self.flat
        draft: list[int] = []
        while alive and len(draft) < budget:
            step = len(draft)
            votes = Counter(flat[at + step] for at, stop in alive if at + step < stop)
            if not votes:
                break
            token, count = votes.most_common(1)[0]
            if 2 * count <= sum(votes.values()):  # no strict majority: a low-confidence branch
                break
            draft.append(token)
            alive = [(at, stop) for at, stop in alive if at + step < stop and flat[at + step] == token]
        return draft, length if draft else 0


class CrossRequestProposer:
    """A session's own suffix proposer and the global index: the proposal behind the longer match wins, the
    session's own on a tie (a sub-task asked again matches the earlier session's prompt and answer over
    max_ngram tokens, where its own history matches a few tokens of its prompt: measured, taking the own
    match whenever there was one left the index 17 of a repeat's 64 draft tokens). Its history joins the
    index when the session closes."""

    def __init__(self, own: SuffixProposer, index: GlobalSuffixIndex) -> None:
        self.own, self.index = own, index
        self.global_drafts = 0  # proposals that came from the index
        self.last_source = "own"  # where the latest proposal came from: "own" (this session's history) | "global"

    def extend(self, tokens: Sequence[int]) -> None:
        self.own.extend(tokens)

    def propose(self, max_tokens: int) -> list[int]:
        draft, length = self.own.propose_matched(max_tokens)
        self.last_source = "own"
        if length >= self.own.max_ngram or max_tokens <= 0:
            return draft  # no match is longer than max_ngram
        other, other_length = self.index.propose_matched(self.own.tokens, max_tokens)
        if other_length <= length:
            return draft
        self.index.count(other)
        self.last_source = "global"
        self.global_drafts += 1
        return other

    def close(self) -> None:
        self.index.submit(self.own.tokens)
        self.own.close()


class GlobalSuffixProposerFactory:
    """`ngram.kind = "suffix"` with a global index of `global_tokens` tokens shared by every session."""

    name = "suffix"
    runs_llama = False

    def __init__(self, config: NgramConfig, global_tokens: int) -> None:
        self.own = SuffixProposerFactory(config)
        self.index = GlobalSuffixIndex(global_tokens, config)

    def for_session(self, session_id: int) -> CrossRequestProposer:
        own = self.own.for_session(session_id)
        assert isinstance(own, SuffixProposer)
        return CrossRequestProposer(own, self.index)

    def close(self) -> None:
        self.own.close()
