"""Drafting across requests: a bounded suffix index at stage 0 over the prompts and outputs of recent
sessions, consulted when a session's own suffix match finds nothing (SuffixDecoding's global tree, the
`suffix` method of vLLM, kept as seed -> occurrences rather than a tree).

Store: whole finished sessions (prompt + committed tokens; queued by `submit` from the thread that releases
them, added by the next lookup in the drafting thread), oldest evicted first, so the tokens held
never exceed `max_tokens` (`--openai-speculative-global-tokens`; a session longer than that keeps its
tail). Index: seed (the last s = min(min_ngram, 8) tokens) -> the (session, end) occurrences of it,
oldest first, so evicting a session pops its entries off the front of each list.

Lookup for a history h of n tokens: the occurrences of h's seed (newest `MAX_CANDIDATES` of them), each
matched backwards against h up to max_ngram tokens; those with the longest match L (>= min_ngram)
are the candidates. Drafting walks them token by token: the next token of each candidate that has one
votes; the top token is proposed only while it holds a strict majority of the votes (per-candidate
counts: where the recent sessions diverge, a low-confidence branch is not proposed), and the candidates
that disagree drop out. At most min(max_tokens, max_proposal_tokens, 2·L) tokens, as the own-history
proposer (skippy.driver.speculative.suffix).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from skippy.config.speculative import NgramConfig
from skippy.driver.speculative.history import NgramHistory
from skippy.driver.speculative.suffix import MATCH_LENGTH_FACTOR, MAX_SEED_TOKENS, SuffixProposerFactory
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
        self.sessions: OrderedDict[int, list[int]] = OrderedDict()
        self.tokens_held = 0
        self._next_id = 0
        self._ends: dict[tuple[int, ...], deque[tuple[int, int]]] = {}
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
                 lambda: len(self.sessions))):
            Gauge(name, doc, registry=self.registry).set_function(read)
        current().attach(self.registry)

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
        sid, self._next_id = self._next_id, self._next_id + 1
        self.sessions[sid] = kept
        self.tokens_held += len(kept)
        s = self.seed_tokens
        for end in range(s, len(kept) + 1):
            self._ends.setdefault(tuple(kept[end - s : end]), deque()).append((sid, end))
        while self.tokens_held > self.max_tokens:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        sid, kept = self.sessions.popitem(last=False)
        self.tokens_held -= len(kept)
        s = self.seed_tokens
        for end in range(s, len(kept) + 1):
            key = tuple(kept[end - s : end])
            entries = self._ends[key]
            entries.popleft()  # the oldest session's entries are at the front of every list
            if not entries:
                del self._ends[key]

    def _candidates(self, history: Sequence[int]) -> tuple[list[tuple[list[int], int]], int]:
        """(session tokens, end) of the longest matches of the history's suffix, and their length L."""
        n, s = len(history), self.seed_tokens
        entries = self._ends.get(tuple(history[n - s :])) if n >= s else None
        best: list[tuple[list[int], int]] = []
        best_length = 0
        for sid, end in itertools.islice(reversed(entries or ()), MAX_CANDIDATES):
            kept = self.sessions[sid]
            limit = min(self.max_ngram, end, n)
            length = s
            while length < limit and kept[end - 1 - length] == history[n - 1 - length]:
                length += 1
            if length > best_length:
                best, best_length = [(kept, end)], length
            elif length == best_length:
                best.append((kept, end))
        return (best, best_length) if best_length >= self.min_ngram else ([], 0)

    def propose(self, history: Sequence[int], max_tokens: int) -> list[int]:
        """Up to max_tokens tokens continuing `history` as earlier sessions did (module docstring)."""
        while self.pending:
            self.add(self.pending.popleft())
        alive, length = self._candidates(history)
        budget = min(max_tokens, self.max_proposal_tokens, MATCH_LENGTH_FACTOR * length)
        draft: list[int] = []
        while alive and len(draft) < budget:
            step = len(draft)
            votes = Counter(kept[end + step] for kept, end in alive if end + step < len(kept))
            if not votes:
                break
            token, count = votes.most_common(1)[0]
            if 2 * count <= sum(votes.values()):  # no strict majority: a low-confidence branch
                break
            draft.append(token)
            alive = [(kept, end) for kept, end in alive if end + step < len(kept) and kept[end + step] == token]
        if draft:
            self.proposals.inc()
            self.proposed_tokens.inc(len(draft))
        return draft


class CrossRequestProposer:
    """A session's own suffix proposer first; the global index when it has nothing. Its history joins the
    index when the session closes."""

    def __init__(self, own: NgramHistory, index: GlobalSuffixIndex) -> None:
        self.own, self.index = own, index
        self.global_drafts = 0  # proposals that came from the index

    def extend(self, tokens: Sequence[int]) -> None:
        self.own.extend(tokens)

    def propose(self, max_tokens: int) -> list[int]:
        draft = self.own.propose(max_tokens)
        if draft or max_tokens <= 0:
            return draft
        draft = self.index.propose(self.own.tokens, max_tokens)
        self.global_drafts += bool(draft)
        return draft

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
        return CrossRequestProposer(self.own.for_session(session_id), self.index)

    def close(self) -> None:
        self.own.close()
