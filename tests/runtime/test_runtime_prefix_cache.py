"""A stage's prefix cache on real llama.cpp (tiny gemma3: sliding-window layers) and the cell ledger.

Recording keeps a copy of a session's first n positions as an entry (its llama.cpp sequence state,
outside the KV pool); a new session restores it and prefills only the rest. The ledger counts each
entry's own cells, and its count per cell agrees with what llama.cpp serialises for a sequence. A restore of a missing entry drops
the window and the session's later windows until it restarts at position 0.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest
from runtime_helpers import prompt_tokens, tiny_spec

from skippy.protocol import PrefixRef
from skippy.runtime.kv_ledger import CellLedger
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow

PROMPT = prompt_tokens(100, seed=11)  # longer than the tiny gemma3's 32-token window


def tokens_window(sid: int, pos: int, n: int, *, outputs: bool = False, **ops: object) -> SessionWindow:
    toks = np.asarray(PROMPT[pos : pos + n], np.int32)
    return SessionWindow(sid, pos, n, tuple(range(n)) if outputs else (), toks, **ops)  # type: ignore[arg-type]


def logits_of(rt: StageRuntime, rows: list[int]) -> np.ndarray:
    return np.stack([rt.logits(r) for r in rows])


@pytest.fixture
def cached(tiny_model: Callable[..., Path], open_stage: Callable[..., StageRuntime]) -> StageRuntime:
    return open_stage(tiny_spec(tiny_model("gemma3"), layer_end=6, lane_count=2, prefix_entries=3))


# -- the ledger (no llama.cpp) ---------------------------------------------------------------------
def test_ledger_counts_each_entry_as_its_own_copy() -> None:
    ledger = CellLedger()
    ledger.write(1, 0, 80)
    ledger.record(1, key=10, n_tokens=64)
    ledger.record(1, key=11, n_tokens=80)
    assert ledger.cells() == 144  # two copies of one session's positions
    ledger.restore(2, key=11, n_tokens=80)
    ledger.write(2, 80, 20)
    assert ledger.holds(2) == 100
    ledger.record(2, key=12, n_tokens=100)
    assert ledger.cells() == 244
    ledger.release(1)
    ledger.release(2)
    assert ledger.cells() == 244 and ledger.holds(1) == 0  # entries outlive their sessions
    ledger.evict(11)
    ledger.evict(12)
    assert ledger.cells() == 64


def test_ledger_a_window_trims_the_session_first() -> None:
    ledger = CellLedger()
    ledger.write(1, 0, 50)
    ledger.record(1, key=1, n_tokens=50)
    ledger.write(1, 40, 3)  # a verify window again at 40: the session now ends at 43
    assert ledger.holds(1) == 43 and ledger.cells() == 50


def test_ledger_fit_evicts_least_recent_and_never_a_pinned_entry() -> None:
    ledger = CellLedger()
    for session, key in ((1, 1), (2, 2), (3, 3)):
        ledger.write(session, 0, 40)
        ledger.record(session, key, 40)
    candidate = 40
    assert ledger.fit(candidate, [1, 2, 3], max_entries=8, max_cells=160) == []
    assert ledger.fit(candidate, [1, 2, 3], max_entries=8, max_cells=120) == [1]
    assert ledger.fit(candidate, [1, 2, 3], max_entries=8, max_cells=120, pinned={1}) == [2]
    assert ledger.fit(candidate, [1, 2, 3], max_entries=2, max_cells=1000) == [1, 2]
    assert ledger.fit(candidate, [1, 2, 3], max_entries=8, max_cells=30) is None  # the entry alone is too big


# -- on llama.cpp ---------------------------------------------------------------------------------
def test_restored_prefix_continues_like_the_session_that_recorded_it(cached: StageRuntime) -> None:
    cached.decode([tokens_window(1, 0, 80, record=(PrefixRef(7, 80),))])
    original = logits_of(cached, cached.decode([tokens_window(1, 80, 20, outputs=True)]).output_rows[0])
    cached.release_session(1)
    assert cached.prefix is not None and cached.prefix.entries == 1
    restored = cached.decode([tokens_window(2, 80, 20, outputs=True, restore=PrefixRef(7, 80))])
    assert cached.session_length(2) == 100 and not restored.missed
    np.testing.assert_allclose(logits_of(cached, restored.output_rows[0]), original, rtol=0, atol=1e-4)
    assert cached.prefix.stats.restores == 1 and cached.prefix.cells == 80  # the entry is still whole


def test_entries_hold_no_cells_of_the_kv_pool(cached: StageRuntime) -> None:
    empty = L.llama_state_get_size(cached.ctx.ptr)  # the whole context's state: it grows with the cells in use
    cached.decode([tokens_window(1, 0, 80, record=(PrefixRef(7, 80),))])
    assert L.llama_state_get_size(cached.ctx.ptr) > empty
    cached.release_session(1)
    assert cached.prefix is not None and cached.prefix.entries == 1
    # no cell is in use: a later decode attends over its own cells, not over the entry's
    assert L.llama_state_get_size(cached.ctx.ptr) == empty


def test_two_sessions_restore_one_entry_in_one_batch(cached: StageRuntime) -> None:
    cached.decode([tokens_window(1, 0, 64, record=(PrefixRef(7, 64),))])
    cached.release_session(1)
    both = cached.decode([tokens_window(2, 64, 8, outputs=True, restore=PrefixRef(7, 64)),
                          tokens_window(3, 64, 8, outputs=True, restore=PrefixRef(7, 64))])
    a, b = (logits_of(cached, rows) for rows in both.output_rows)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)  # same prefix, same tokens
    assert cached.session_length(2) == cached.session_length(3) == 72


def test_a_missing_entry_drops_the_window_until_the_session_restarts(cached: StageRuntime) -> None:
    cached.decode([tokens_window(1, 0, 10)])
    result = cached.decode([tokens_window(1, 10, 5, outputs=True),
                            tokens_window(2, 64, 4, outputs=True, restore=PrefixRef(99, 64))])
    assert result.missed == (2,) and result.output_rows[1] == [] and len(result.output_rows[0]) == 5
    later = cached.decode([tokens_window(2, 68, 4, outputs=True)])  # the rest of the abandoned prefill
    assert later.missed == (2,) and later.output_rows == [[]]
    restart = cached.decode([tokens_window(2, 0, 4, outputs=True)])  # stage 0 restarts it at 0
    assert not restart.missed and cached.session_length(2) == 4
    assert cached.prefix is not None and cached.prefix.stats.misses == 1


def test_non_final_stage_forwards_only_the_rows_of_windows_it_ran(tiny_model: Callable[..., Path],
                                                                  open_stage: Callable[..., StageRuntime]) -> None:
    head = open_stage(tiny_spec(tiny_model("gemma3"), layer_end=3, lane_count=2, prefix_entries=2))
    full = head.decode([tokens_window(1, 0, 6)]).hidden
    result = head.decode([tokens_window(2, 8, 3, restore=PrefixRef(5, 8)), tokens_window(3, 0, 6)])
    assert result.missed == (2,) and result.hidden is not None and result.hidden.shape == (6, head.n_embd)
    assert np.array_equal(result.hidden, full)  # session 3 ran exactly what session 1 ran
    nothing = head.decode([tokens_window(4, 8, 3, restore=PrefixRef(5, 8))])
    assert nothing.missed == (4,) and nothing.hidden is not None and nothing.hidden.shape == (0, head.n_embd)


def test_own_bounds_evict_least_recently_used(tiny_model: Callable[..., Path],
                                              open_stage: Callable[..., StageRuntime]) -> None:
    rt = open_stage(tiny_spec(tiny_model("gemma3"), layer_end=6, lane_count=1, prefix_entries=2))
    assert rt.prefix is not None
    for key in (1, 2, 3):
        rt.decode([tokens_window(0, 0, 20 + key, record=(PrefixRef(key, 20 + key),))])
        rt.release_session(0)
    assert rt.prefix.entries == 2 and rt.prefix.stats.own_evictions == 1
    assert not rt.prefix.has(PrefixRef(1, 21)) and rt.prefix.has(PrefixRef(3, 23))


def test_byte_cap_bounds_the_cells_entries_hold(tiny_model: Callable[..., Path],
                                                open_stage: Callable[..., StageRuntime]) -> None:
    probe = open_stage(tiny_spec(tiny_model("gemma3"), layer_end=6, lane_count=1, prefix_entries=1))
    assert probe.prefix is not None
    cap = 50 * probe.prefix.cell_bytes
    rt = open_stage(tiny_spec(tiny_model("gemma3"), layer_end=6, lane_count=1, prefix_entries=4, prefix_max_bytes=cap))
    assert rt.prefix is not None and rt.prefix.max_cells == 50
    for key, n in ((1, 30), (2, 30), (3, 60)):
        rt.decode([tokens_window(0, 0, n, record=(PrefixRef(key, n),))])
        rt.release_session(0)
        assert rt.prefix.cells * rt.prefix.cell_bytes <= cap
    assert rt.prefix.entries == 1 and rt.prefix.stats.unfit == 1  # 60 cells never fit
    assert rt.prefix.summary()["peak_bytes"] <= cap


def test_cell_bytes_match_what_llama_cpp_keeps_per_position(cached: StageRuntime) -> None:
    cached.decode([tokens_window(0, 0, 16)])  # within the 32-token window: every layer keeps every cell
    before = L.llama_state_seq_get_size(cached.ctx.ptr, 0)
    cached.decode([tokens_window(0, 16, 1)])
    grown = L.llama_state_seq_get_size(cached.ctx.ptr, 0) - before
    assert cached.prefix is not None
    assert 0 <= grown - cached.prefix.cell_bytes <= 24  # + position and sequence ids, per cache (base, sliding)


def test_a_restore_takes_the_first_positions_of_a_longer_entry(tiny_model: Callable[..., Path],
                                                               open_stage: Callable[..., StageRuntime]) -> None:
    cached = open_stage(tiny_spec(tiny_model("llama"), layer_end=6, lane_count=2, prefix_entries=3))
    assert cached.prefix is not None and cached.prefix.caps.partial
    cached.decode([tokens_window(1, 0, 90, record=(PrefixRef(7, 90),))])
    original = logits_of(cached, cached.decode([tokens_window(1, 60, 10, outputs=True)]).output_rows[0])
    cached.release_session(1)
    restored = cached.decode([tokens_window(2, 60, 10, outputs=True, restore=PrefixRef(7, 60))])
    assert cached.session_length(2) == 70 and not restored.missed
    np.testing.assert_allclose(logits_of(cached, restored.output_rows[0]), original, rtol=0, atol=1e-4)


def test_sliding_window_entries_are_restored_whole_only(cached: StageRuntime) -> None:
    cached.decode([tokens_window(1, 0, 90, record=(PrefixRef(7, 90),))])
    cached.release_session(1)
    assert cached.prefix is not None and not cached.prefix.caps.partial  # gemma3: its state keeps the last window
    assert cached.prefix.has(PrefixRef(7, 90)) and not cached.prefix.has(PrefixRef(7, 60))
