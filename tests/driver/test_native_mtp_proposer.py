"""Stage 0's native-MTP proposer (skippy.driver.speculative.native_mtp) through the Speculation engine.

The final stage's drafts are proposed while they continue the committed history; the composite plan appends
an n-gram cache tail; `reject_cooldown_tokens`, `suppress_cooldown_drafts` and `suppress_cooldown_draft_limit`
do what their names say, and the drafts are counted by source.
"""

from __future__ import annotations

from typing import Any

from skippy.config.speculative import SpeculativeDecodeConfig
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.native_mtp import NativeMtpProposerFactory
from skippy.driver.speculative.window import FixedWindow

REPEATING = [5, 6, 7, 8] * 4  # the n-gram cache drafts 5 6 7 8 ... after it


def engine(native_mtp: dict[str, Any], tail: bool = False) -> Speculation:
    plan: dict[str, Any] = {"native_mtp": {"enabled": True, **native_mtp}}
    if tail:
        plan |= {"ngram": {"kind": "cache", "min_ngram": 1, "max_ngram": 4, "max_proposal_tokens": 6},
                 "extension": {"max_tokens": 3}}
    speculation = Speculation(NativeMtpProposerFactory(SpeculativeDecodeConfig.from_dict(plan)), FixedWindow(6), 6)
    speculation.start(0, REPEATING)
    return speculation


def step(speculation: Speculation, committed: list[int], mtp: tuple[int, ...]) -> list[int]:
    """The next window's drafts; then `committed` come back (accepted drafts + 1) with the final stage's MTP drafts."""
    proposal, k = speculation.draft(0, budget=16, active_sessions=1)
    drafts = proposal[:k]
    speculation.committed(0, len(drafts), len(committed), committed)
    speculation.receive_mtp(0, mtp)
    return drafts


def test_mtp_drafts_are_proposed_while_they_continue_the_history() -> None:
    speculation = engine({"max_draft_tokens": 2})
    assert speculation.name == "native-mtp"
    assert step(speculation, [9], (10, 11, 12)) == []  # nothing received yet
    assert step(speculation, [10, 11, 3], (4,)) == [10, 11]  # max_draft_tokens 2; both accepted, then 3
    spec = speculation.sessions[0]
    spec.proposer.extend([99])  # committed without a new reply: the pending drafts no longer continue it
    assert speculation.draft(0, 16, 1) == ([], 0)
    totals = speculation.totals
    assert (totals.proposed_by_source, totals.accepted_by_source) == ({"native_mtp": 2}, {"native_mtp": 2})


def test_min_draft_tokens_drops_shorter_mtp_drafts() -> None:
    speculation = engine({"max_draft_tokens": 3, "min_draft_tokens": 2})
    step(speculation, [9], (10,))
    assert step(speculation, [10], (11, 12)) == []  # one draft < min 2
    assert step(speculation, [11, 12, 13], ()) == [11, 12]


def test_composite_plan_extends_the_mtp_prefix_with_an_ngram_tail() -> None:
    speculation = engine({"max_draft_tokens": 1}, tail=True)
    assert speculation.name == "native-mtp+ngram-cache"
    step(speculation, [5], (6,))  # history ... 8 5; MTP says 6
    assert step(speculation, [6, 7, 8, 5, 1], ()) == [6, 7, 8, 5]  # MTP prefix 6 + the cache's 7 8 5 (max 3)
    # the first window's tail (5 6 7 from the cache, nothing from MTP yet) was rejected at once: 3 + 3 sent
    totals = speculation.totals
    assert totals.proposed_by_source == {"native_mtp": 1, "ngram_extension": 6}
    assert totals.accepted_by_source == {"native_mtp": 1, "ngram_extension": 3}


def test_reject_cooldown_tokens_keep_mtp_drafts_off_after_a_rejection() -> None:
    without = engine({"max_draft_tokens": 1})
    step(without, [9], (10,))
    assert step(without, [3], (20,)) == [10]  # rejected: 3 instead of 10
    assert step(without, [20], (21,)) == [20]  # no cooldown: the next reply's draft is proposed at once

    cooling = engine({"max_draft_tokens": 1, "reject_cooldown_tokens": 2})
    step(cooling, [9], (10,))
    assert step(cooling, [3], (20,)) == [10]  # rejected
    assert [step(cooling, [tok], (tok + 1,)) for tok in (30, 40)] == [[], []]  # the next 2 tokens: no MTP drafts
    assert step(cooling, [41], ()) == [41]  # then drafting resumes


def test_suppress_cooldown_drafts_limits_the_tail_while_cooling_down() -> None:
    for suppress, limit, tail in ((False, 0, 3), (True, 1, 1), (True, 0, 0)):
        speculation = engine({"max_draft_tokens": 1, "reject_cooldown_tokens": 4, "suppress_cooldown_drafts": suppress,
                              "suppress_cooldown_draft_limit": limit}, tail=True)
        step(speculation, [5], (9,))
        step(speculation, [6], (7,))  # 9 rejected (the tail after it too): cooling down for 4 tokens
        drafts = step(speculation, [7], ())
        assert len(drafts) == tail, (suppress, limit, drafts)  # no MTP prefix; the n-gram tail as limited
