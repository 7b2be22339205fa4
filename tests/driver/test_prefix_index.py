"""Stage 0's prefix cache index (skippy.driver.prefix_index), without llama.cpp.

Admission looks a prompt up (the longest whole entry that begins it, leaving at least one token to
run) and picks where it is recorded (its end and shared-prefix grid points); the scheduler ends
prefill chunks there; launching a batch yields each window's restore / evict / record within the
bounds the stages announced, least recently used evicted first, never an entry a session waits to
restore; a chain miss restarts the prefill at 0 and forgets the entries involved on every stage.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from skippy.config import KvCacheConfig, KvCacheMode, PrefillChunkOptions, PrefillChunkPolicy
from skippy.driver.prefill import ChunkPlanner
from skippy.driver.prefix_index import PrefixIndex
from skippy.driver.scheduler import PlannedWindow, plan_iteration
from skippy.driver.sequence import Sequence
from skippy.protocol import CacheCaps, KeptPrefix, PrefixRef
from skippy.request_events import RequestHandle
from skippy.runtime.sampling import SamplingParams

CONFIG = KvCacheConfig(mode=KvCacheMode.LOOKUP_RECORD, min_tokens=16, shared_prefix_stride_tokens=32,
                       shared_prefix_record_limit=2)
CAPS = CacheCaps(cells=1000, entries=8, cell_bytes=100)
_sessions = itertools.count(1)


def request(tokens: list[int] | np.ndarray, chunk: int = 512) -> Sequence:
    sid = next(_sessions)
    return Sequence(f"r{sid}", sid, np.asarray(tokens, np.int32), SamplingParams(), 8, frozenset(),
                    ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.FIXED, chunk_size=chunk)),
                    RequestHandle(f"r{sid}"))


def prefill(index: PrefixIndex, seq: Sequence) -> list[list[tuple[int, int]]]:
    """Plan and 'launch' the whole prompt one chunk per batch; per batch (window end, records...)."""
    batches = []
    while seq.prefilling:
        plan = plan_iteration([seq], 10_000, 1)
        ops = index.window_ops(plan)
        seq.prefilled = plan[0].pos_start + len(plan[0].tokens)
        batches.append([(plan[0].pos_start + len(plan[0].tokens), r.n_tokens) for r in ops[0].record])
    return batches


def prompt(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 400, n).astype(np.int32)


def admitted(index: PrefixIndex, tokens: np.ndarray) -> Sequence:
    seq = request(tokens)
    index.admit(seq)
    return seq


def served(index: PrefixIndex, tokens: np.ndarray) -> Sequence:
    """A request admitted, its prompt prefilled (and recorded), its session released."""
    seq = admitted(index, tokens)
    prefill(index, seq)
    index.release([seq.session_id])
    return seq


def test_records_at_the_end_which_serves_every_shorter_prefix() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CAPS)
    seq = admitted(index, prompt(100))
    assert seq.prefix.status == "miss" and seq.prefix.points == (100,)
    assert prefill(index, seq) == [[(100, 100)]]
    assert index.snapshot()["entries"] == 1 and index.cells == 100
    other = admitted(index, np.concatenate([seq.prompt[:40], prompt(30, seed=5)]))
    assert (other.prefix.status, other.prefix.matched) == ("hit", 40)  # the first 40 positions of the entry


def test_whole_entries_only_record_at_grid_points_and_chunks_end_there() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CacheCaps(cells=1000, entries=8, cell_bytes=100, partial=False))
    seq = admitted(index, prompt(100))
    assert seq.prefix.status == "miss" and seq.prefix.points == (32, 64, 100)  # grid points a stride below the end
    assert prefill(index, seq) == [[(32, 32)], [(64, 64)], [(100, 100)]]
    assert index.snapshot()["entries"] == 3 and index.cells == 196  # a copy each
    other = admitted(index, np.concatenate([seq.prompt[:40], prompt(30, seed=5)]))
    assert (other.prefix.status, other.prefix.matched) == ("hit", 32)  # the whole 32-token entry, not 40 of 64


def test_a_longer_entry_supersedes_the_ones_it_begins_with() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CAPS)
    first = prompt(100)
    served(index, first)
    follow = admitted(index, np.concatenate([first, prompt(30, seed=1)]))
    prefill(index, follow)
    assert index.snapshot()["entries"] == 1 and index.snapshot()["superseded"] == 1 and index.cells == 130


def test_a_longer_prompt_restores_the_longest_whole_entry() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CAPS)
    first = prompt(100)
    served(index, first)
    follow = admitted(index, np.concatenate([first, prompt(30, seed=1)]))
    assert (follow.prefix.status, follow.prefix.hit_kind, follow.prefix.matched, follow.prefilled) == ("hit", "prompt", 100, 100)
    plan = plan_iteration([follow], 10_000, 1)
    ops = index.window_ops(plan)
    assert plan[0].pos_start == 100 and ops[0].restore == PrefixRef(index.key(first), 100)
    assert follow.prefix.restore is None and not index._pins  # launched: the entry is no longer pinned


def test_the_same_prompt_again_restores_all_but_its_last_token() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CAPS)
    tokens = prompt(100)
    served(index, tokens)
    again = admitted(index, tokens)
    # the first 99 positions of the prompt's own entry; its last token must run to give logits
    assert (again.prefix.matched, again.prefix.hit_kind) == (99, "prompt")
    assert again.prefix.restore == PrefixRef(index.key(tokens), 99)
    assert again.prefix.points == ()  # every point is recorded already


def test_a_prompt_that_leaves_an_entry_midway_restores_the_shared_part() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CAPS)
    first = prompt(100)
    served(index, first)
    fork = np.concatenate([first[:80], prompt(40, seed=7)])
    assert fork[80] != first[80]
    follow = admitted(index, fork)
    assert (follow.prefix.matched, follow.prefix.restore) == (80, PrefixRef(index.key(first), 80))
    assert follow.prefilled == 80


def test_short_prompts_and_another_model_do_not_hit() -> None:
    index = PrefixIndex(CONFIG, "model|topo", CAPS)
    tokens = prompt(100)
    served(index, tokens)
    short = admitted(index, tokens[:12])
    assert short.prefix.matched == 0 and short.prefix.points == ()  # under min_tokens
    assert PrefixIndex(CONFIG, "other|topo", CAPS).key(tokens) != index.key(tokens)


def test_bounds_evict_least_recently_used_but_not_an_entry_a_session_waits_for() -> None:
    index = PrefixIndex(KvCacheConfig(mode=KvCacheMode.LOOKUP_RECORD, min_tokens=16, shared_prefix_record_limit=0),
                        "m|t", CacheCaps(cells=120, entries=8, cell_bytes=1))
    seqs = [served(index, prompt(50, seed=s)) for s in range(2)]
    waiting = request(np.concatenate([seqs[0].prompt, prompt(5, seed=9)]))
    index.admit(waiting)  # pins the entry of prompt 0, the least recently used
    third = admitted(index, prompt(50, seed=3))
    plan = plan_iteration([third], 10_000, 1)
    ops = index.window_ops(plan)
    assert ops[0].evict == (index.key(seqs[1].prompt),) and ops[0].record[0].n_tokens == 50
    assert third.prefix.evictions == 1 and index.snapshot()["evictions"] == 1


def test_chain_miss_restarts_at_zero_and_forgets_the_entries_on_every_stage() -> None:
    index = PrefixIndex(CONFIG, "m|t", CAPS)
    first = prompt(64)
    served(index, first)
    follow = admitted(index, np.concatenate([first, prompt(40, seed=2)]))
    first_ops = index.window_ops(plan_iteration([follow], 10_000, 1))
    assert first_ops[0].evict == (index.key(first),)  # superseded by the longer entry the window records
    index.chain_miss(follow)
    assert (follow.prefilled, follow.attempt, follow.prefix.status, follow.prefix.matched) == (0, 1, "chain_miss", 0)
    assert follow.prefix.points == (104,)  # recorded again from 0
    again = index.window_ops(plan_iteration([follow], 10_000, 1))
    assert set(again[0].evict) == {index.key(follow.prompt)}  # the entry it recorded, forgotten on every stage
    assert again[0].restore is None and follow.prefix.stats(0, 0, 0).chain_misses == 1


def test_a_finished_request_keeps_its_prompt_and_reply_at_release() -> None:
    index = PrefixIndex(CONFIG, "m|t", CAPS)
    seq = admitted(index, prompt(100))
    prefill(index, seq)
    for token in (7, 8, 9):  # three decode steps: the last sampled token never runs
        seq.generated.append(token)
        index.window_ops(plan_iteration([seq], 10_000, 1))
    seq.generated.append(10)
    index.finish(seq, keep=True)
    kept, evict = index.take_kept()
    tokens = np.concatenate([seq.prompt, [7, 8, 9]]).astype(np.int32)
    assert kept == (KeptPrefix(seq.session_id, PrefixRef(index.key(tokens), 103)),)
    assert evict == (index.key(seq.prompt),)  # the prompt's entry: the reply's begins with it
    assert index.cells == 103
    follow = admitted(index, np.concatenate([tokens, [10], prompt(20, seed=5)]))
    assert (follow.prefix.matched, follow.prefix.hit_kind) == (103, "reply")


def test_nothing_is_kept_after_a_failure_or_when_the_kv_runs_past_the_reply() -> None:
    index = PrefixIndex(CONFIG, "m|t", CAPS)
    failed, drafted = admitted(index, prompt(100)), admitted(index, prompt(100, seed=1))
    for seq in (failed, drafted):
        prefill(index, seq)
        seq.generated += [7, 8]
    index.window_ops([PlannedWindow(drafted, 100, np.array([7, 5, 6], np.int32), (0, 1, 2), (5, 6))])  # drafts rejected
    index.finish(failed, keep=False)
    index.finish(drafted, keep=True)
    assert index.take_kept() == ((), ())


@pytest.mark.parametrize("config", [None, KvCacheConfig(mode=KvCacheMode.AUTO)])
def test_off_unless_recording(config: KvCacheConfig | None) -> None:
    index = PrefixIndex(config, "m|t", CAPS)
    seq = admitted(index, prompt(100))
    assert not index.enabled and seq.prefix.status == "disabled" and index.stats(seq) is None
    assert index.window_ops([PlannedWindow(seq, 0, seq.prompt, ())])[0].record == ()


def test_a_downstream_stage_without_a_cache_turns_it_off() -> None:
    index = PrefixIndex(CONFIG, "m|t", CAPS)
    index.set_downstream(CacheCaps(cells=50, entries=2, cell_bytes=7))
    assert index.caps == CacheCaps(cells=50, entries=2, cell_bytes=107)
    index.set_downstream(None)
    assert not index.enabled
