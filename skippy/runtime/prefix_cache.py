"""A stage's prefix cache: prompt prefixes kept as copies of a lane's llama.cpp sequence state.

Stage 0 decides what to keep (`skippy.driver.prefix_index`); the windows of a batch tell every
stage what to restore, evict and record (`Window.restore/evict/record`), and every stage applies
the same operations in the same order. An entry is a sequence number after the lanes' whose KV is kept
outside the KV pool, as the lane's sequence state (skippy.runtime.entry_states): recording is
`seq_cp(lane -> entry, [0, n))`, a copy out; restoring `seq_rm(lane)` then `seq_cp(entry -> lane, [0, n))`,
a copy into new cells of the lane (`kv_ledger` counts both). So entries never take the lanes' cells, nor
lengthen the KV every decode attends over.

An entry is recorded at the end of a window, when the lane holds exactly the positions it keeps. A restore
may take an entry's first positions only, except with sliding-window layers: llama.cpp's sequence state keeps
only the positions their window still reaches from the entry's last one, so such an entry is restored whole or
all but its last position (`partial` False in the stage's `CacheCaps`).

A stage that lacks an entry it is told to restore (it restarted, or its bounds are smaller than the
ones stage 0 knows) drops that window and the session's later windows until stage 0 restarts the
session at position 0, and reports the session as `missed`. Its own bounds (`max_entries`, the
bytes in `kv_cache.max_bytes`) are enforced here too, least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from skippy.faults import fault_active
from skippy.protocol import CacheCaps, KeptPrefix, PrefixRef
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.kv_ledger import CellLedger
from skippy.runtime.windows import DecodeResult, SessionWindow


class KvSequences(Protocol):
    def seq_rm(self, seq: int, p0: int) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...
    def seq_pos_max(self, seq: int) -> int: ...


def _per_layer(value: object, n_layer: int, name: str) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    if not isinstance(value, int):
        raise ValueError(f"GGUF {name} is {value!r}")
    return [value] * n_layer


def kv_cell_bytes(path: Path, cache_type_k: str, cache_type_v: str) -> int:
    """KV bytes of one position over every layer of the GGUF at `path` (a slice's stop block has a
    KV cache too), for the given cache element types."""
    return sum(kv_layer_bytes(path, cache_type_k, cache_type_v))


def kv_layer_bytes(path: Path, cache_type_k: str, cache_type_v: str) -> list[int]:
    """KV bytes of one position in each layer of the GGUF at `path`, for the given cache element types."""
    gguf = GGUFFile(path)
    try:
        arch = gguf.get("general.architecture")
        n_layer = gguf.get(f"{arch}.block_count")
        n_embd = gguf.get(f"{arch}.embedding_length")
        assert isinstance(n_layer, int) and isinstance(n_embd, int)
        heads = _per_layer(gguf.get(f"{arch}.attention.head_count"), n_layer, "head_count")
        heads_kv = _per_layer(gguf.get(f"{arch}.attention.head_count_kv", heads), n_layer, "head_count_kv")
        k_len, v_len = gguf.get(f"{arch}.attention.key_length"), gguf.get(f"{arch}.attention.value_length")
    finally:
        gguf.close()
    per_layer = []
    for layer in range(n_layer):
        head_dim = n_embd // max(1, heads[layer])
        total = 0
        for length, kind in ((k_len, cache_type_k), (v_len, cache_type_v)):
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind.upper()]]
            total += heads_kv[layer] * (int(length) if isinstance(length, int) else head_dim) // block * size
        per_layer.append(total)
    return per_layer


def chain_caps(own: CacheCaps | None, downstream: CacheCaps | None, has_downstream: bool) -> CacheCaps | None:
    """What this stage and every stage after it can keep together; None if one of them keeps nothing."""
    if own is None or not has_downstream:
        return own
    if downstream is None:
        return None
    return CacheCaps(min(own.cells, downstream.cells), min(own.entries, downstream.entries),
                     own.cell_bytes + downstream.cell_bytes, own.partial and downstream.partial)


@dataclass
class PrefixCacheStats:
    restores: int = 0
    misses: int = 0  # restores asked for an entry this stage does not have
    records: int = 0
    evictions: int = 0  # told by stage 0
    own_evictions: int = 0  # by this stage's own bounds
    unfit: int = 0  # records skipped: the entry alone exceeds the bounds


class PrefixCache:
    def __init__(self, kv: KvSequences, lanes: Mapping[int, int], first_seq: int, max_entries: int, max_cells: int,
                 cell_bytes: int, partial: bool = True) -> None:
        self.kv, self.lanes = kv, lanes  # lanes: the runtime's session -> lane sequence
        self.max_entries, self.max_cells, self.cell_bytes = max_entries, max_cells, cell_bytes
        self.partial = partial  # False: sliding-window layers keep only an entry's last window, so restore it whole
        self._free = list(range(first_seq + max_entries - 1, first_seq - 1, -1))
        self._entries: OrderedDict[int, tuple[int, int]] = OrderedDict()  # key -> (sequence, n_tokens); LRU first
        self._waiting: set[int] = set()  # sessions that missed a restore: dropped until restarted at 0
        self.ledger = CellLedger()
        self.stats = PrefixCacheStats()
        self.peak_cells = 0

    @property
    def caps(self) -> CacheCaps:
        return CacheCaps(self.max_cells, self.max_entries, self.cell_bytes, self.partial)

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def cells(self) -> int:
        return self.ledger.cells()

    def summary(self) -> dict[str, int]:
        """Entries, the bytes they hold now and at most so far, this stage's cap, and the counters."""
        return {"entries": self.entries, "bytes": self.cells * self.cell_bytes,
                "peak_bytes": self.peak_cells * self.cell_bytes, "max_bytes": self.max_cells * self.cell_bytes,
                **vars(self.stats)}

    def has(self, ref: PrefixRef) -> bool:
        entry = self._entries.get(ref.key)
        # a restore may take the first n of an entry; with sliding-window layers, which kept only the last window's
        # positions, all of it or all but its last position (whose window the kept positions still cover)
        return entry is not None and entry[1] >= ref.n_tokens >= (0 if self.partial else entry[1] - 1)

    # -- a batch: restores before the decode, evictions and records after it ---------------------
    def restore(self, windows: Sequence[SessionWindow], lane_for: Callable[[int], int]) -> list[int]:
        """Apply the windows' restores; returns the sessions whose windows must be dropped (missed)."""
        missed = []
        for w in windows:
            sid = w.session_id
            if w.restore is not None:
                if not self.has(w.restore):
                    self.stats.misses += 1
                    self._waiting.add(sid)
                    missed.append(sid)
                    continue
                self._waiting.discard(sid)
                seq, n = self._entries[w.restore.key][0], w.restore.n_tokens
                lane = lane_for(sid)
                self.kv.seq_rm(lane, 0)
                self.kv.seq_cp(seq, lane, 0, n)
                self._entries.move_to_end(w.restore.key)
                self.ledger.restore(sid, w.restore.key, n)
                self.stats.restores += 1
            elif sid in self._waiting:
                if w.pos_start > 0:
                    missed.append(sid)
                else:
                    self._waiting.discard(sid)  # stage 0 restarted it
        return missed

    def finish(self, windows: Sequence[SessionWindow], missed: Sequence[int]) -> None:
        """After the decode: the windows' rows are in KV; evict, then record, window by window."""
        for w in windows:
            if w.session_id not in missed:
                self.ledger.write(w.session_id, w.pos_start, w.n_tokens)
        for w in windows:
            self.evict(w.evict)
            if w.session_id not in missed:
                for ref in w.record:
                    self._record(w.session_id, ref)

    def keep(self, kept: Sequence[KeptPrefix], evict: Sequence[int]) -> None:
        """Before sessions are released (ReleaseSessions): evict, then keep each session's prefix, only
        if its KV ends exactly there (as it does after its last window)."""
        self.evict(evict)
        for k in kept:
            lane = self.lanes.get(k.session_id)
            if lane is not None and self.kv.seq_pos_max(lane) + 1 == k.ref.n_tokens:
                self._record(k.session_id, k.ref)
            else:
                self.stats.unfit += 1

    def evict(self, keys: Sequence[int]) -> None:
        for key in keys:
            self.stats.evictions += self._evict(key)

    def _record(self, session: int, ref: PrefixRef) -> None:
        self._evict(ref.key)  # recorded again: the new copy replaces the old
        if fault_active("prefix.record"):  # tests: a stage that lost its entries
            return
        evict = self.ledger.fit(ref.n_tokens, list(self._entries), self.max_entries, self.max_cells)
        if evict is None:
            self.stats.unfit += 1
            return
        for key in evict:
            self.stats.own_evictions += self._evict(key)
        seq = self._free.pop()
        self.kv.seq_cp(self.lanes[session], seq, 0, ref.n_tokens)
        self._entries[ref.key] = (seq, ref.n_tokens)
        self.ledger.record(session, ref.key, ref.n_tokens)
        self.stats.records += 1
        self.peak_cells = max(self.peak_cells, self.ledger.cells())

    def _evict(self, key: int) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.kv.seq_rm(entry[0], 0)
        self._free.append(entry[0])
        self.ledger.evict(key)
        return True

    # -- sessions ---------------------------------------------------------------------------------
    def release(self, session: int) -> None:
        self.ledger.release(session)
        self._waiting.discard(session)

    def clear(self) -> int:
        """Drop every entry (a new upstream: its index starts empty); returns how many there were."""
        keys = list(self._entries)
        for key in keys:
            self._evict(key)
        return len(keys)


def keep_rows(windows: Sequence[SessionWindow], hidden: np.ndarray | None,
              missed: Sequence[int]) -> tuple[list[SessionWindow], np.ndarray | None]:
    """The windows not missed, and their rows of `hidden` (a copy; only after a miss)."""
    kept = [w for w in windows if w.session_id not in missed]
    if hidden is None:
        return kept, None
    starts = np.cumsum([0, *(w.n_tokens for w in windows)])
    rows = [hidden[starts[i] : starts[i + 1]] for i, w in enumerate(windows) if w.session_id not in missed]
    return kept, np.concatenate(rows) if rows else hidden[:0]


def with_missed(result: DecodeResult, windows: Sequence[SessionWindow], missed: Sequence[int]) -> DecodeResult:
    """`result` of the kept windows, with output rows for every window again (none for a missed one)."""
    rows = iter(result.output_rows)
    return replace(result, output_rows=[[] if w.session_id in missed else next(rows) for w in windows],
                   missed=tuple(missed))
