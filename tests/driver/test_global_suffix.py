"""The global suffix index (drafting across requests): bounded by tokens, consulted with the session's own
match (the longer match proposes, the own on a tie), and proposing only while recent sessions agree
(per-candidate counts)."""

from __future__ import annotations

import pytest

from skippy.config.speculative import NgramConfig, NgramKind
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixIndex, GlobalSuffixProposerFactory
from skippy.driver.speculative.window import FixedWindow

NGRAM = NgramConfig(kind=NgramKind.SUFFIX, min_ngram=3, max_ngram=8, max_proposal_tokens=16)
TOOL_CALL = list(range(100, 130))  # what an earlier session emitted


def test_a_finished_session_is_drafted_from_by_the_next_one() -> None:
    factory = GlobalSuffixProposerFactory(NGRAM, 1000)
    first = factory.for_session(1)
    first.extend([1, 2, 3, 4])
    first.extend(TOOL_CALL)
    assert first.propose(8) == []  # nothing repeats in its own history, nothing finished before it
    first.close()
    second = factory.for_session(2)
    second.extend([9, 9, 7, *TOOL_CALL[:6]])  # a new prompt that reaches the same tool call
    assert second.propose(8) == TOOL_CALL[6:14] and second.global_drafts == 1
    assert factory.index.registry.get_sample_value("skippy_speculative_global_proposals_total") == 1


def test_the_sessions_own_match_wins_a_tie() -> None:
    factory = GlobalSuffixProposerFactory(NGRAM, 1000)
    factory.index.add([5, 6, 7, 50, 51, 52, 53])
    session = factory.for_session(1)
    session.extend([5, 6, 7, 60, 61, 62, 5, 6, 7])  # both match [5, 6, 7]
    assert session.propose(3) == [60, 61, 62] and session.global_drafts == 0
    # the index was asked, but its proposal was not used: the metrics count none
    assert factory.index.registry.get_sample_value("skippy_speculative_global_proposals_total") == 0


def test_a_longer_match_in_the_index_beats_a_short_own_match() -> None:
    """A sub-task asked again: its prompt matches an earlier session's prompt and answer over many tokens,
    its own history only a few tokens of its prompt."""
    factory = GlobalSuffixProposerFactory(NGRAM, 1000)
    factory.index.add([1, 2, 3, 4, 5, 6, 7, *TOOL_CALL])
    session = factory.for_session(1)
    session.extend([5, 6, 7, 90, 91, 1, 2, 3, 4, 5, 6, 7])  # own: [5, 6, 7] -> 90; the index: 7 tokens -> TOOL_CALL
    assert session.propose(4) == TOOL_CALL[:4] and session.global_drafts == 1
    assert session.last_source == "global"


def test_a_branch_without_a_strict_majority_is_not_proposed() -> None:
    index = GlobalSuffixIndex(1000, NGRAM)
    index.add([1, 2, 3, 4, 5, 10, 11])
    index.add([1, 2, 3, 4, 5, 20, 21])
    assert index.propose([8, 3, 4, 5], 8) == []  # one vote each for 10 and 20
    index.add([1, 2, 3, 4, 5, 20, 21, 22])
    # 20 has 2 of 3 votes; after 21 one of the two candidates ended (no vote), the other goes on
    assert index.propose([8, 3, 4, 5], 8) == [20, 21, 22]
    index.add([1, 2, 3, 4, 5, 20, 21, 23])
    assert index.propose([8, 3, 4, 5], 8) == [20, 21]  # 22 and 23 one vote each


def test_the_index_holds_at_most_its_token_budget() -> None:
    index = GlobalSuffixIndex(20, NGRAM)
    index.add(list(range(1, 13)))
    index.add(list(range(30, 42)))  # 24 tokens: the oldest session is evicted with all its entries
    assert index.tokens_held == 12 and len(index.starts) == 1
    assert index.propose([2, 3, 4], 4) == [] and index.propose([31, 32, 33], 4) == [34, 35, 36, 37]
    index.add(list(range(200, 260)))  # longer than the budget: its last 20 tokens
    assert index.tokens_held == 20 and index.propose([241, 242, 243], 2) == [244, 245]
    for _ in range(60):  # evicted entries are dropped once they outnumber the live ones twice over (+ slack)
        index.add(list(range(300, 320)))
    assert index._entries <= 2 * index.tokens_held + 1024 and index.propose([301, 302, 303], 2) == [304, 305]
    with pytest.raises(ValueError, match=">= 0 tokens"):
        GlobalSuffixIndex(-1, NGRAM)


def test_zero_tokens_keeps_nothing() -> None:
    index = GlobalSuffixIndex(0, NGRAM)
    index.add(TOOL_CALL)
    assert index.tokens_held == 0 and index.propose(TOOL_CALL[:5], 4) == []


def test_a_sessions_summary_counts_its_drafts_from_the_index() -> None:
    factory = GlobalSuffixProposerFactory(NGRAM, 1000)
    speculation = Speculation(factory, FixedWindow(4), 4)
    speculation.start(1, [1, 2, 3, *TOOL_CALL])
    speculation.release([1])
    speculation.start(2, [7, *TOOL_CALL[:5]])
    assert speculation.draft(2, 64, 1) == (TOOL_CALL[5:9], 4)
    summary = speculation.summary(2)
    assert summary is not None and summary["global_drafts"] == 1
