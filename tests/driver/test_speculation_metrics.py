"""Stage 0's view of the window policy on /metrics: running sessions by their current k (0: decoding
plainly with shadow drafts) and their mean acceptance estimate."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from skippy.config.speculative import NgramConfig, NgramKind
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixProposerFactory
from skippy.driver.speculative.metrics import SpeculationCollector
from skippy.driver.speculative.suffix import SuffixProposerFactory
from skippy.driver.speculative.window import ALPHA_PRIOR, FixedWindow

NGRAM = NgramConfig(kind=NgramKind.SUFFIX, min_ngram=3, max_ngram=8, max_proposal_tokens=8)


def test_sessions_are_counted_by_their_current_window() -> None:
    speculation = Speculation(SuffixProposerFactory(NGRAM), FixedWindow(4), 4)
    registry = CollectorRegistry()
    registry.register(SpeculationCollector(speculation))
    assert registry.get_sample_value("skippy_speculative_alpha_mean") == 0.0
    speculation.start(1, list(range(10, 30)) * 2)  # repeats itself: a draft of 4
    speculation.start(2, list(range(10, 30)))  # nothing to match: decodes plainly
    speculation.draft_all([1, 2], 64, 2)
    by_k = {k: registry.get_sample_value("skippy_speculative_sessions_by_k", {"k": str(k)}) for k in range(5)}
    assert by_k == {0: 1, 1: 0, 2: 0, 3: 0, 4: 1}
    assert registry.get_sample_value("skippy_speculative_alpha_mean") == ALPHA_PRIOR
    speculation.release([1, 2])
    assert registry.get_sample_value("skippy_speculative_sessions_by_k", {"k": "4"}) == 0


def test_each_session_shows_its_k_and_drafts_are_counted_by_source() -> None:
    factory = GlobalSuffixProposerFactory(NGRAM, 1024)
    speculation = Speculation(factory, FixedWindow(4), 4)
    registry = CollectorRegistry()
    registry.register(SpeculationCollector(speculation))
    earlier = list(range(100, 140))
    speculation.start(1, earlier)
    speculation.release([1])  # joins the global index
    speculation.start(2, list(range(10, 30)) * 2)  # drafts from its own history
    speculation.start(3, earlier[:12])  # nothing of its own to match: drafts from session 1's tokens
    drafts = speculation.draft_all([2, 3], 64, 2)
    assert {sid: k for sid, (_tokens, k) in drafts.items()} == {2: 4, 3: 4}
    assert registry.get_sample_value("skippy_speculative_session_k", {"session": "3"}) == 4
    assert registry.get_sample_value("skippy_speculative_session_alpha", {"session": "2"}) == ALPHA_PRIOR
    speculation.committed(2, 4, 5, drafts[2][0] + [7])  # all 4 of its own drafts accepted
    speculation.committed(3, 4, 3, earlier[12:15])  # 2 of the index's 4 accepted
    value = registry.get_sample_value
    assert value("skippy_speculative_source_proposed_tokens_total", {"source": "own"}) == 4
    assert value("skippy_speculative_source_accepted_tokens_total", {"source": "own"}) == 4
    assert value("skippy_speculative_source_proposed_tokens_total", {"source": "global"}) == 4
    assert value("skippy_speculative_source_accepted_tokens_total", {"source": "global"}) == 2
    speculation.release([2, 3])
    assert value("skippy_speculative_session_k", {"session": "3"}) is None
