"""The model-free proposers (skippy.driver.speculative.suffix, .ngram_cache).

Suffix: the longest earlier match of the history's suffix (seed = last min(min_ngram, 8) tokens,
compared backwards up to max_ngram), ties to the most recent, proposes what followed it: at most
min(max_tokens, max_proposal_tokens, 2 × match length) tokens and never past the end of the history.
Cache: llama.cpp's context n-gram cache; greedy drafting from the longest n-gram whose continuation
has >= {2,2,1,1} samples and a top share >= {66,50,50,50}% for n = 1..4, ties to the token seen last.

Both are checked against brute-force oracles that rescan the whole history on every call, after
extending in random chunks (so incremental indexing = building from the whole history at once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy.config.speculative import NgramConfig, NgramKind
from skippy.driver.speculative import Proposer, ProposerFactory
from skippy.driver.speculative.draft_model import DraftModelProposerFactory
from skippy.driver.speculative.ngram_cache import NgramCacheProposer, NgramCacheProposerFactory
from skippy.driver.speculative.suffix import SuffixProposer, SuffixProposerFactory


def suffix(history: list[int], min_ngram: int = 3, max_ngram: int = 16, max_proposal_tokens: int = 64) -> SuffixProposer:
    proposer = SuffixProposer(min_ngram, max_ngram, max_proposal_tokens)
    proposer.extend(history)
    return proposer


def cache(history: list[int], min_ngram: int = 1, max_ngram: int = 4, max_proposal_tokens: int = 64) -> NgramCacheProposer:
    proposer = NgramCacheProposer(min_ngram, max_ngram, max_proposal_tokens)
    proposer.extend(history)
    return proposer


# ---------------------------------------------------------------- brute-force oracles


def suffix_oracle(h: list[int], min_ngram: int, max_ngram: int, max_proposal_tokens: int, k: int) -> list[int]:
    seed, n = min(min_ngram, 8), len(h)
    best: tuple[int, int] | None = None  # (length, end): max() picks the longest, then the latest end
    for end in range(seed, n):
        length = 0
        while length < min(max_ngram, end) and h[end - 1 - length] == h[n - 1 - length]:
            length += 1
        if length >= seed and (best is None or (length, end) > best):
            best = (length, end)
    if best is None or best[0] < min_ngram or k <= 0:
        return []
    length, end = best
    return h[end : end + min(k, max_proposal_tokens, 2 * length)]


def cache_oracle(h: list[int], min_ngram: int, max_ngram: int, max_proposal_tokens: int, k: int) -> list[int]:
    if len(h) < 2:
        return []
    draft: list[int] = []
    while len(draft) < min(k, max_proposal_tokens):
        x = h + draft
        token = None
        for n in range(max_ngram, min_ngram - 1, -1):
            if n > len(x):
                continue
            followers = [(h[i], i) for i in range(n, len(h)) if h[i - n : i] == x[-n:]]
            if not followers:
                continue
            counts = Counter(t for t, _ in followers)
            top_count = max(counts.values())
            top = max((i, t) for t, i in followers if counts[t] == top_count)[1]  # the one seen last
            if len(followers) >= (2, 2, 1, 1)[n - 1] and 100 * top_count >= (66, 50, 50, 50)[n - 1] * len(followers):
                token = top
                break
        if token is None:
            break
        draft.append(token)
    return draft


@st.composite
def chunked_history(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """A random history over a small alphabet (many repeats) and the cut points it is extended at."""
    history = draw(st.lists(st.integers(0, draw(st.integers(1, 4))), max_size=60))
    cuts = sorted(draw(st.lists(st.integers(0, len(history)), max_size=6)))
    return history, cuts


ORACLES = [
    (SuffixProposer, suffix_oracle, st.tuples(st.integers(1, 10), st.integers(0, 12), st.integers(1, 20))),
    (NgramCacheProposer, cache_oracle, st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(1, 20))),
]


@pytest.mark.parametrize(("make", "oracle", "bounds"), ORACLES, ids=["suffix", "cache"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_incremental_extend_matches_whole_history_oracle(
    make: type, oracle: Callable[..., list[int]], bounds: st.SearchStrategy[tuple[int, int, int]], data: st.DataObject
) -> None:
    history, cuts = data.draw(chunked_history())
    min_ngram, extra, max_proposal_tokens = data.draw(bounds)
    max_ngram = min_ngram + extra if make is SuffixProposer else min(4, min_ngram + extra)
    proposer = make(min_ngram, max_ngram, max_proposal_tokens)
    start = 0
    for cut in [*cuts, len(history)]:
        proposer.extend(history[start:cut])
        start = cut
        for k in (0, 1, 3, 25):
            assert proposer.propose(k) == oracle(history[:cut], min_ngram, max_ngram, max_proposal_tokens, k)


# ---------------------------------------------------------------- suffix


def test_suffix_proposes_what_followed_and_runs_into_the_current_suffix() -> None:
    proposer = suffix([1, 2, 3, 4, 5, 6, 1, 2, 3])
    assert proposer.match() == (3, 3)
    assert proposer.propose(4) == [4, 5, 6, 1]
    assert proposer.propose(100) == [4, 5, 6, 1, 2, 3]  # 2 × match length (3), also the history end


def test_suffix_never_proposes_past_the_history_end() -> None:
    assert suffix([1, 2, 3, 4, 1, 2, 3]).propose(100) == [4, 1, 2, 3]
    # periodic: the longest match is the most recent overlapping one, with one token after it
    assert suffix([7, 7, 7, 7, 7]).propose(100) == [7]


def test_suffix_longest_match_beats_a_more_recent_shorter_one() -> None:
    history = [7, 1, 2, 3, 4, 50, 8, 2, 3, 4, 60, 0, 7, 1, 2, 3, 4]
    assert suffix(history, max_ngram=16).match() == (5, 5)
    assert suffix(history).propose(1) == [50]


def test_suffix_tie_goes_to_the_most_recent_match() -> None:
    history = [1, 2, 3, 10, 5, 1, 2, 3, 20, 6, 1, 2, 3]
    assert suffix(history).propose(1) == [20]
    assert suffix(history).propose(10) == [20, 6, 1, 2, 3]


def test_suffix_max_ngram_caps_the_comparison_so_longer_matches_tie() -> None:
    history = [5, 1, 2, 3, 10, 6, 1, 2, 3, 20, 5, 1, 2, 3]
    assert suffix(history, max_ngram=4).propose(1) == [10]  # 4 tokens (5,1,2,3) beat 3
    assert suffix(history, max_ngram=3).propose(1) == [20]  # both capped at 3: the most recent


def test_suffix_no_match_or_too_short_history_proposes_nothing() -> None:
    assert suffix([1, 2, 3, 4, 5, 6]).propose(8) == []
    assert suffix([1, 2]).propose(8) == []  # shorter than the seed
    assert suffix([]).propose(8) == []
    assert suffix([1, 2, 3, 9, 1, 2]).propose(8) == []  # (1, 2) matches, but the seed is 3 tokens
    assert suffix([1, 2, 3, 1, 2, 3]).propose(0) == []


def test_suffix_seed_is_capped_at_8_and_shorter_matches_stay_silent() -> None:
    assert SuffixProposer(10, 32, 8).seed_tokens == 8
    body = list(range(100, 109))  # 9 tokens
    assert suffix([0, *body, 50, 1, *body], min_ngram=10, max_ngram=32).propose(4) == []  # match of 9 < 10
    assert suffix([0, *body, 50, 0, *body], min_ngram=10, max_ngram=32).propose(4) == [50, 0, 100, 101]


def test_suffix_budget_is_min_of_caller_config_and_twice_the_match() -> None:
    s = list(range(100, 140))
    history = s + s[:5]
    assert suffix(history, max_proposal_tokens=64).propose(100) == s[5:15]  # 2 × 5
    assert suffix(history, max_proposal_tokens=4).propose(100) == s[5:9]
    assert suffix(history, max_proposal_tokens=64).propose(2) == s[5:7]


def test_suffix_re_emission_proposes_the_rest_of_the_sequence() -> None:
    rng = np.random.default_rng(0)
    s = [int(t) for t in rng.integers(0, 50, size=120)]
    proposer = suffix(s + s[:8], max_ngram=32)
    emitted, rounds = s[:8], 0
    while len(emitted) < len(s):
        accepted = proposer.propose(16)[: len(s) - len(emitted)]  # past the end of s it wraps into the copy
        assert accepted, f"silent after {len(emitted)} tokens"
        assert accepted == s[len(emitted) : len(emitted) + len(accepted)]
        proposer.extend(accepted)
        emitted += accepted
        rounds += 1
    assert rounds == 7  # 16 tokens a round: the first match is 8 long, then longer


def test_suffix_re_emission_with_a_rename_recovers_after_the_seed() -> None:
    s = [10, 11, 12, 13, 99, 14, 15, 16, 17, 18, 19, 20, 99, 21, 22, 23]  # 99 = the renamed identifier
    renamed = [77 if t == 99 else t for t in s]
    proposer = suffix(s + renamed[:4])
    assert proposer.propose(16) == [99, 14, 15, 16, 17, 18, 19, 20]  # the old name: rejected at verify
    proposer.extend([77])
    assert proposer.propose(16) == []  # seed (12, 13, 77) is new
    proposer.extend([14, 15])
    assert proposer.propose(16) == []  # (77, 14, 15) is new
    proposer.extend([16])
    assert proposer.propose(16) == [17, 18, 19, 20, 99, 21]  # the match (14, 15, 16) is 3 long


# ---------------------------------------------------------------- cache


def test_cache_unigram_needs_two_samples() -> None:
    assert cache([5, 7, 5], max_ngram=1).propose(1) == []  # 5 → 7 seen once
    assert cache([5, 7, 5, 7, 5], max_ngram=1).propose(1) == [7]
    assert cache([5, 7, 5, 7, 5], max_ngram=1).propose(4) == [7, 5, 7, 5]  # drafting continues on the draft


def test_cache_unigram_needs_a_66_percent_share() -> None:
    assert cache([5, 7, 5, 7, 5, 8, 5], max_ngram=1).propose(1) == [7]  # 2 of 3 = 66.7%
    assert cache([5, 7, 5, 7, 5, 7, 5, 8, 5, 8, 5], max_ngram=1).propose(1) == []  # 3 of 5 = 60%


def test_cache_bigram_needs_two_samples_and_half_with_ties_to_the_latest() -> None:
    assert cache([1, 2, 3, 1, 2], min_ngram=2, max_ngram=2).propose(1) == []
    assert cache([1, 2, 3, 1, 2, 3, 1, 2], min_ngram=2, max_ngram=2).propose(1) == [3]
    assert cache([1, 2, 3, 1, 2, 4, 1, 2], min_ngram=2, max_ngram=2).propose(1) == [4]  # 50% tie: latest
    assert cache([1, 2, 4, 1, 2, 3, 1, 2], min_ngram=2, max_ngram=2).propose(1) == [3]
    assert cache([1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2], min_ngram=2, max_ngram=2).propose(1) == [3]  # 2 beats 1


def test_cache_trigram_and_4gram_need_one_sample() -> None:
    assert cache([1, 2, 3, 9, 1, 2, 3], min_ngram=3, max_ngram=3).propose(1) == [9]
    assert cache([1, 2, 3, 4, 9, 1, 2, 3, 4], min_ngram=4, max_ngram=4).propose(1) == [9]
    assert cache([1, 2, 3, 9, 1, 2, 3], min_ngram=4, max_ngram=4).propose(1) == []


def test_cache_longest_passing_ngram_wins_then_falls_back_to_shorter() -> None:
    history = [1, 2, 3, 4, 50, 7, 4, 60, 8, 4, 60, 9, 4, 60, 1, 2, 3, 4]
    assert cache(history).propose(1) == [50]  # the 4-gram (1, 2, 3, 4) → 50 beats 4 → 60 (3 of 4)
    assert cache(history[:-4] + [6, 4]).propose(1) == [60]  # (6, 4) unseen: the unigram 4 → 60


def test_cache_history_shorter_than_two_and_budget() -> None:
    assert cache([]).propose(4) == []
    assert cache([5]).propose(4) == []
    assert cache([5, 7, 5, 7, 5], max_ngram=1).propose(0) == []
    assert cache([5, 7, 5, 7, 5], max_ngram=1, max_proposal_tokens=3).propose(10) == [7, 5, 7]


def test_cache_counts_ngrams_spanning_two_extend_calls() -> None:
    proposer = NgramCacheProposer(3, 3, 8)
    for chunk in ([1, 2], [3], [4], [1, 2, 3]):
        proposer.extend(chunk)
    followers = proposer.followers((1, 2, 3))
    assert followers is not None and followers.counts == {4: 1}
    assert proposer.propose(1) == [4]


def test_cache_re_emission_proposes_the_rest_of_the_sequence() -> None:
    s = list(range(100, 160))  # distinct: every 3- and 4-gram has one continuation
    proposer = cache(s + s[:3], max_proposal_tokens=100)
    assert proposer.propose(len(s) - 3) == s[3:]
    assert proposer.propose(100)[len(s) - 3 :] == s[:43]  # then around again: s[-1] was followed by s[0]


# ---------------------------------------------------------------- factories and lifecycle


@pytest.mark.parametrize(
    ("factory_type", "kind"), [(SuffixProposerFactory, NgramKind.SUFFIX), (NgramCacheProposerFactory, NgramKind.CACHE)]
)
def test_factory_makes_independent_sessions_with_the_config(factory_type: type, kind: NgramKind) -> None:
    factory: ProposerFactory = factory_type(NgramConfig(kind=kind, min_ngram=3, max_ngram=4, max_proposal_tokens=2))
    assert factory.name == kind.value
    first: Proposer = factory.for_session(1)
    second: Proposer = factory.for_session(2)
    first.extend([1, 2, 3, 4, 5, 6, 1, 2, 3])
    assert first.propose(8) == [4, 5]  # max_proposal_tokens = 2
    assert second.propose(8) == []
    first.close()
    assert first.propose(8) == []
    factory.close()


@pytest.mark.parametrize("factory_type", [SuffixProposerFactory, NgramCacheProposerFactory])
def test_factory_refuses_the_other_kind(factory_type: type) -> None:
    other = NgramKind.CACHE if factory_type is SuffixProposerFactory else NgramKind.SUFFIX
    with pytest.raises(ValueError, match="ngram.kind"):
        factory_type(NgramConfig(kind=other, min_ngram=3, max_ngram=4, max_proposal_tokens=8))


@pytest.mark.parametrize(
    ("make", "bounds"),
    [(SuffixProposer, (0, 3, 8)), (SuffixProposer, (4, 3, 8)), (SuffixProposer, (3, 3, 0)), (NgramCacheProposer, (1, 5, 8))],
)
def test_bad_bounds_are_refused(make: type, bounds: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        make(*bounds)


def test_numpy_tokens_are_accepted() -> None:
    history = np.array([1, 2, 3, 4, 1, 2, 3], dtype=np.int32)
    assert suffix(list(history)).propose(8) == [4, 1, 2, 3]
    proposer = NgramCacheProposer(3, 3, 8)
    proposer.extend(history)  # type: ignore[arg-type]
    assert proposer.propose(4) == [4, 1, 2, 3]
    assert all(type(t) is int for t in proposer.propose(8))


def test_only_the_draft_model_drafts_in_the_runtime_thread() -> None:
    """n-gram proposers are pure Python and draft on stage 0's event loop (no thread round trip a step);
    the draft model runs llama.cpp and so drafts in the runtime thread."""
    assert SuffixProposerFactory.runs_llama is False and NgramCacheProposerFactory.runs_llama is False
    assert DraftModelProposerFactory.runs_llama is True
