"""The iteration scheduler (skippy.driver.scheduler): which rows of which sessions form the next micro-batch.

Decode rows come first (one per decoding session whose previous step is back; input = its last
generated token at position len(prompt) + len(generated) - 1), then prefill chunks FIFO within the
token budget (a chunk is cut to what is left). In-flight and cancelled sessions are skipped. The last
chunk of a prompt asks for one output at its last offset, earlier chunks for none. `max_decode_rows`
splits the decoding sessions over the micro-batches kept in flight.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from skippy.config import PrefillChunkOptions, PrefillChunkPolicy
from skippy.driver.prefill import ChunkPlanner
from skippy.driver.scheduler import PlannedWindow, decode_rows_per_iteration, plan_iteration
from skippy.driver.sequence import Sequence
from skippy.request_events import RequestHandle
from skippy.runtime.sampling import SamplingParams

NO_LIMIT = 1 << 30


def seq(session_id: int, prompt_len: int, *, chunk: int = 64, prefilled: int = 0, generated: tuple[int, ...] = (),
        in_flight: bool = False, cancelled: bool = False) -> Sequence:
    """A session whose prompt tokens are distinct (session_id * 10000 + position), so rows are traceable."""
    prompt = np.arange(prompt_len, dtype=np.int32) + session_id * 10000
    return Sequence(
        request_id=f"req-{session_id}", session_id=session_id, prompt=prompt, sampling=SamplingParams(),
        max_tokens=64, stop_tokens=frozenset(),
        planner=ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.FIXED, chunk_size=chunk)),
        handle=RequestHandle(f"req-{session_id}"), prefilled=prefilled, generated=list(generated), in_flight=in_flight,
        cancelled=cancelled,
    )


def decoding(session_id: int, prompt_len: int = 5, generated: tuple[int, ...] = (7,), **kw: object) -> Sequence:
    return seq(session_id, prompt_len, prefilled=prompt_len, generated=generated, **kw)  # type: ignore[arg-type]


def rows(plan: list[PlannedWindow]) -> int:
    return sum(len(w.tokens) for w in plan)


def summary(plan: list[PlannedWindow]) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(session, pos_start, n tokens, outputs) per window."""
    return [(w.seq.session_id, w.pos_start, len(w.tokens), w.outputs) for w in plan]


def check_windows_match_their_sessions(plan: list[PlannedWindow]) -> None:
    for w in plan:
        assert w.tokens.dtype == np.int32
        if w.is_prefill:
            assert np.array_equal(w.tokens, w.seq.prompt[w.pos_start : w.pos_start + len(w.tokens)])
        else:
            assert w.tokens.tolist() == [w.seq.generated[-1]]


# --- decode rows -----------------------------------------------------------------------------------------------


def test_decode_row_is_the_last_generated_token_at_its_position() -> None:
    s = decoding(1, prompt_len=5, generated=(11, 12, 13))
    plan = plan_iteration(deque([s]), token_budget=16, max_decode_rows=NO_LIMIT)
    assert len(plan) == 1
    w = plan[0]
    assert w.seq is s
    assert w.pos_start == 5 + 3 - 1
    assert w.tokens.tolist() == [13]
    assert w.outputs == (0,)
    assert not w.is_prefill


def test_first_decode_row_follows_the_prompt() -> None:
    """Right after prefill (one generated token) the row sits at len(prompt), the first free position."""
    plan = plan_iteration(deque([decoding(1, prompt_len=9, generated=(42,))]), 16, NO_LIMIT)
    assert summary(plan) == [(1, 9, 1, (0,))]
    assert plan[0].tokens.tolist() == [42]


def test_decode_rows_come_first_then_prefill_in_fifo_order() -> None:
    running = deque([seq(1, 40, chunk=16), decoding(2), seq(3, 10, chunk=16), decoding(4)])
    plan = plan_iteration(running, token_budget=64, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [
        (2, 5, 1, (0,)),
        (4, 5, 1, (0,)),
        (1, 0, 16, ()),  # not the last chunk of session 1: no output
        (3, 0, 10, (9,)),  # the whole prompt of session 3: output at its last offset
    ]
    check_windows_match_their_sessions(plan)


def test_one_decode_row_per_session() -> None:
    running = deque([decoding(i, generated=(1, 2, 3)) for i in range(4)])
    plan = plan_iteration(running, token_budget=100, max_decode_rows=NO_LIMIT)
    assert [w.seq.session_id for w in plan] == [0, 1, 2, 3]
    assert rows(plan) == 4


@pytest.mark.parametrize("flag", ["in_flight", "cancelled"])
def test_in_flight_and_cancelled_decoders_are_skipped(flag: str) -> None:
    running = deque([decoding(1, **{flag: True}), decoding(2), decoding(3, **{flag: True}), decoding(4)])
    plan = plan_iteration(running, 16, NO_LIMIT)
    assert [w.seq.session_id for w in plan] == [2, 4]


def test_cancelled_prefills_are_skipped() -> None:
    running = deque([seq(1, 20, cancelled=True), seq(2, 20), seq(3, 20, prefilled=10, cancelled=True)])
    plan = plan_iteration(running, 64, NO_LIMIT)
    assert summary(plan) == [(2, 0, 20, (19,))]


def test_prefill_chunks_of_a_prompt_in_flight_are_pipelined() -> None:
    """Chunk k+1 needs nothing back from chunk k: it is planned while k is still in the pipeline."""
    running = deque([seq(1, 40, chunk=16, prefilled=16, in_flight=True), seq(2, 20, chunk=16)])
    plan = plan_iteration(running, 64, NO_LIMIT)
    assert summary(plan) == [(1, 16, 16, ()), (2, 0, 16, ())]


def test_skipped_sessions_do_not_use_budget_or_decode_slots() -> None:
    running = deque([decoding(1, in_flight=True), decoding(2, cancelled=True), decoding(3), seq(4, 10, cancelled=True),
                     seq(5, 10)])
    plan = plan_iteration(running, token_budget=11, max_decode_rows=1)
    assert summary(plan) == [(3, 5, 1, (0,)), (5, 0, 10, (9,))]


def test_session_waiting_for_its_first_token_gets_no_row() -> None:
    """Prompt fully sent but no token back yet: nothing to decode and nothing left to prefill."""
    plan = plan_iteration(deque([seq(1, 12, prefilled=12), seq(2, 4)]), 64, NO_LIMIT)
    assert summary(plan) == [(2, 0, 4, (3,))]


# --- prefill chunks and the token budget -----------------------------------------------------------------------


def test_prefill_chunk_is_the_planner_size() -> None:
    plan = plan_iteration(deque([seq(1, 100, chunk=32)]), token_budget=64, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [(1, 0, 32, ())]
    check_windows_match_their_sessions(plan)


def test_prefill_continues_from_prefilled() -> None:
    plan = plan_iteration(deque([seq(1, 100, chunk=32, prefilled=32)]), 64, NO_LIMIT)
    assert summary(plan) == [(1, 32, 32, ())]
    assert plan[0].tokens.tolist() == list(range(10032, 10064))


def test_last_chunk_is_the_rest_of_the_prompt_and_asks_for_its_last_offset() -> None:
    plan = plan_iteration(deque([seq(1, 100, chunk=32, prefilled=96)]), 64, NO_LIMIT)
    assert summary(plan) == [(1, 96, 4, (3,))]
    assert plan[0].is_prefill
    check_windows_match_their_sessions(plan)


def test_chunks_of_one_prompt_over_successive_iterations() -> None:
    s = seq(1, 70, chunk=32)
    seen = []
    while s.prefilling:
        (w,) = plan_iteration(deque([s]), 64, NO_LIMIT)
        seen.append((w.pos_start, len(w.tokens), w.outputs))
        s.prefilled += len(w.tokens)  # what the driver does once the chunk is sent
    assert seen == [(0, 32, ()), (32, 32, ()), (64, 6, (5,))]


def test_chunk_is_cut_to_the_budget() -> None:
    plan = plan_iteration(deque([seq(1, 100, chunk=64)]), token_budget=40, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [(1, 0, 40, ())]


def test_chunk_cut_to_the_budget_that_ends_the_prompt_asks_for_an_output() -> None:
    plan = plan_iteration(deque([seq(1, 100, chunk=64, prefilled=60)]), token_budget=40, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [(1, 60, 40, (39,))]


def test_prefills_share_the_budget_fifo_and_the_last_one_is_cut() -> None:
    running = deque([seq(1, 100, chunk=64), seq(2, 100, chunk=64), seq(3, 100, chunk=64)])
    plan = plan_iteration(running, token_budget=100, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [(1, 0, 64, ()), (2, 0, 36, ())]
    assert rows(plan) == 100


def test_decode_rows_count_against_the_budget() -> None:
    running = deque([seq(1, 100, chunk=64), decoding(2), decoding(3), decoding(4)])
    plan = plan_iteration(running, token_budget=10, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [(2, 5, 1, (0,)), (3, 5, 1, (0,)), (4, 5, 1, (0,)), (1, 0, 7, ())]
    assert rows(plan) == 10


def test_budget_taken_by_decode_rows_leaves_no_prefill() -> None:
    running = deque([seq(1, 10), decoding(2), decoding(3), decoding(4)])
    plan = plan_iteration(running, token_budget=2, max_decode_rows=NO_LIMIT)
    assert summary(plan) == [(2, 5, 1, (0,)), (3, 5, 1, (0,))]


def test_zero_budget_plans_nothing() -> None:
    assert plan_iteration(deque([decoding(1), seq(2, 10)]), token_budget=0, max_decode_rows=NO_LIMIT) == []


def test_empty_running_plans_nothing() -> None:
    assert plan_iteration(deque(), token_budget=64, max_decode_rows=4) == []


def test_rows_never_exceed_the_budget() -> None:
    rng = np.random.default_rng(1234)
    for _ in range(300):
        running: deque[Sequence] = deque()
        for sid in range(int(rng.integers(0, 8))):
            prompt_len = int(rng.integers(1, 300))
            if rng.random() < 0.5:
                s = decoding(sid, prompt_len=prompt_len, generated=tuple(range(1, int(rng.integers(2, 5)))))
            else:
                s = seq(sid, prompt_len, chunk=int(rng.integers(1, 200)), prefilled=int(rng.integers(0, prompt_len)))
            s.in_flight = bool(rng.random() < 0.2)
            s.cancelled = bool(rng.random() < 0.1)
            running.append(s)
        budget = int(rng.integers(0, 256))
        max_decode = int(rng.integers(1, 6))
        plan = plan_iteration(running, budget, max_decode)
        assert rows(plan) <= budget
        assert len({id(w.seq) for w in plan}) == len(plan)  # at most one window per session
        assert all(not w.seq.cancelled and not (w.seq.in_flight and not w.is_prefill) for w in plan)
        assert all(len(w.tokens) >= 1 for w in plan)
        decode = [w for w in plan if not w.is_prefill]
        assert len(decode) <= max_decode
        assert all(a is b for a, b in zip(plan, decode))  # decode rows first
        prefill_order = [w.seq.session_id for w in plan if w.is_prefill]
        assert prefill_order == sorted(prefill_order)  # FIFO (session ids were appended in order)
        for w in plan:
            if w.is_prefill:
                end = w.pos_start + len(w.tokens)
                assert w.pos_start == w.seq.prefilled and end <= len(w.seq.prompt)
                assert len(w.tokens) <= w.seq.planner.size()
                assert w.outputs == ((len(w.tokens) - 1,) if end == len(w.seq.prompt) else ())
        check_windows_match_their_sessions(plan)


# --- micro-batches of decoding sessions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_running", "in_flight", "expected"),
    [
        (16, 2, 8),
        (5, 2, 3),
        (0, 3, 1),
        (1, 4, 1),
        (4, 4, 1),
        (9, 4, 3),
        (7, 1, 7),
        (7, 0, 7),  # no iterations in flight counts as one
    ],
)
def test_decode_rows_per_iteration(n_running: int, in_flight: int, expected: int) -> None:
    assert decode_rows_per_iteration(n_running, in_flight) == expected


def test_max_decode_rows_limits_decode_rows_but_not_prefill() -> None:
    running = deque([*(decoding(i) for i in range(5)), seq(9, 20)])
    plan = plan_iteration(running, token_budget=64, max_decode_rows=2)
    assert summary(plan) == [(0, 5, 1, (0,)), (1, 5, 1, (0,)), (9, 0, 20, (19,))]


def test_max_decode_rows_splits_decoders_over_micro_batches_in_flight() -> None:
    """With the planned sessions marked in flight, the next iteration takes the next ones: disjoint batches."""
    running = deque(decoding(i) for i in range(5))
    per_iteration = decode_rows_per_iteration(len(running), 2)
    assert per_iteration == 3
    batches = []
    for _ in range(3):
        plan = plan_iteration(running, token_budget=64, max_decode_rows=per_iteration)
        for w in plan:
            w.seq.in_flight = True
        batches.append([w.seq.session_id for w in plan])
    assert batches == [[0, 1, 2], [3, 4], []]
    running[1].in_flight = False  # its step came back
    assert [w.seq.session_id for w in plan_iteration(running, 64, per_iteration)] == [1]


def test_sixteen_decoders_over_two_iterations() -> None:
    running = deque(decoding(i) for i in range(16))
    per_iteration = decode_rows_per_iteration(16, 2)
    first = plan_iteration(running, 64, per_iteration)
    for w in first:
        w.seq.in_flight = True
    second = plan_iteration(running, 64, per_iteration)
    assert [w.seq.session_id for w in first] == list(range(8))
    assert [w.seq.session_id for w in second] == list(range(8, 16))


def test_sequence_progress_properties() -> None:
    s = seq(1, 10)
    assert s.prefilling and s.length == 0
    s.prefilled = 10
    assert not s.prefilling and s.length == 10
    s.generated = [5]
    assert s.length == 10  # the first token is not yet in KV
    s.generated = [5, 6, 7]
    assert s.length == 12


@pytest.mark.parametrize("generated", [(), (7, 8, 9)], ids=["paused-while-prefilling", "paused-while-decoding"])
def test_a_replayed_session_commits_its_next_token(generated: tuple[int, ...]) -> None:
    """After a replay (a later stage died) the window that samples the session's next token is of the session's
    current epoch, so its prediction is committed: a session paused while it still prefilled (nothing generated)
    gets its first token, one paused while decoding its next (a regression: the prefill's last chunk once
    carried epoch 0, was discarded as stale, and the request hung)."""
    from skippy.driver.batches import InFlight
    from skippy.driver.postprocess import postprocess
    from skippy.protocol import Predictions, SessionPrediction

    s = seq(1, 10, chunk=64, prefilled=6 if not generated else 10, generated=generated)
    s.chunk_ends[:] = [10]
    s.replay()
    while True:
        plan = plan_iteration([s], NO_LIMIT, 4)
        assert len(plan) == 1
        s.in_flight += 1
        s.prefilled = max(s.prefilled, plan[0].pos_start + len(plan[0].tokens))
        outcomes = postprocess(InFlight(plan, 0.0), Predictions(1, (SessionPrediction(1, (42,)),)), 512)
        if not plan[0].is_prefill or plan[0].outputs:
            break
        assert outcomes == []
    assert len(s.generated) == len(generated) + 1 and s.generated[-1] == 42
    assert [t for o in outcomes for e in o.events for t in e.tokens] == [42]
