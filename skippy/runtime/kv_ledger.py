"""The KV cells prefix cache entries hold, counted without asking llama.cpp.

With the unified KV cache `llama_memory_seq_cp` copies nothing: a cell just belongs to one more
sequence (checked in the pinned llama.cpp, `llama_kv_cache::seq_cp`: same stream, only the cells'
sequence sets change). A cell is free again once no sequence holds it. So a session that restored
an entry shares the entry's cells, an entry recorded from that session shares them again, and the
cells a cache holds are fewer than the sum of its entries' lengths.

`CellLedger` follows every operation that changes which sequence holds which positions (a window
written at `pos_start`, which first trims the session there; releases; restores; records;
evictions) as runs of positions of one *generation* of cells, and counts the cells the entries hold,
shared cells once. Stage 0's index and every stage keep one and apply the same operations in the
same order, so they agree. llama.cpp's sliding-window cache may reuse a cell only an entry holds
once the entry's window no longer reaches it; the count is then an upper bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

Segment = tuple[int, int, int]  # (generation, first position, end position): cells made together


def _cut(segments: Iterable[Segment], end: int) -> list[Segment]:
    """The runs restricted to positions below `end`."""
    return [(gen, p0, min(p1, end)) for gen, p0, p1 in segments if p0 < end]


def count_cells(runs: Iterable[Segment]) -> int:
    """Distinct cells in `runs` (runs of one generation may overlap: they are the same cells)."""
    by_gen: dict[int, list[tuple[int, int]]] = {}
    for gen, p0, p1 in runs:
        by_gen.setdefault(gen, []).append((p0, p1))
    total = 0
    for spans in by_gen.values():
        end = -1
        for p0, p1 in sorted(spans):
            if p1 > end:
                total += p1 - max(p0, end)
                end = p1
    return total


class CellLedger:
    """Which cells each session and each cache entry holds (see the module docstring)."""

    def __init__(self) -> None:
        self.sessions: dict[int, list[Segment]] = {}
        self.entries: dict[int, list[Segment]] = {}
        self._generations = itertools.count()
        self._writing: dict[int, int] = {}  # session -> generation its next new cells belong to

    def write(self, session: int, pos_start: int, n_tokens: int) -> None:
        """A window of `n_tokens` rows at `pos_start` (the session is trimmed there first)."""
        self.trim(session, pos_start)
        runs = self.sessions.setdefault(session, [])
        gen = self._writing.get(session)
        if gen is None:
            gen = self._writing[session] = next(self._generations)
        if runs and runs[-1][0] == gen and runs[-1][2] == pos_start:
            runs[-1] = (gen, runs[-1][1], pos_start + n_tokens)
        else:
            runs.append((gen, pos_start, pos_start + n_tokens))

    def trim(self, session: int, pos: int) -> None:
        runs = self.sessions.get(session)
        if runs and runs[-1][2] > pos:
            self.sessions[session] = _cut(runs, pos)
            self._writing.pop(session, None)  # positions written again are new cells

    def release(self, session: int) -> None:
        self.sessions.pop(session, None)
        self._writing.pop(session, None)

    def restore(self, session: int, key: int, n_tokens: int) -> None:
        self.sessions[session] = _cut(self.entries.get(key, ()), n_tokens)
        self._writing.pop(session, None)

    def record(self, session: int, key: int, n_tokens: int) -> None:
        self.entries[key] = self.recorded(session, n_tokens)

    def recorded(self, session: int, n_tokens: int) -> list[Segment]:
        """The cells an entry of the session's first `n_tokens` positions would hold."""
        return _cut(self.sessions.get(session, ()), n_tokens)

    def evict(self, key: int) -> None:
        self.entries.pop(key, None)

    def clear_entries(self) -> None:
        self.entries.clear()

    def cells(self, without: Collection[int] = (), extra: Iterable[Segment] = ()) -> int:
        """Cells held by the entries (except `without`, plus an entry of cells `extra` to be)."""
        runs = [seg for key, segs in self.entries.items() if key not in without for seg in segs]
        return count_cells([*runs, *extra])

    def entry_only_cells(self) -> int:
        """Cells only entries hold: what evicting every entry would free."""
        held = [seg for segs in self.sessions.values() for seg in segs]
        return count_cells([*held, *(seg for segs in self.entries.values() for seg in segs)]) - count_cells(held)

    def fit(self, candidate: list[Segment], lru: Iterable[int], max_entries: int, max_cells: int,
            pinned: Collection[int] = ()) -> list[int] | None:
        """Entries to evict, least recently used first and never a pinned one, so that the entries
        plus one more holding `candidate` stay within `max_entries` and `max_cells`; None if they cannot."""
        evicted: list[int] = []

        def over() -> bool:
            return (len(self.entries) - len(evicted) + 1 > max_entries
                    or self.cells(evicted, candidate) > max_cells)

        for key in lru:
            if not over():
                break
            if key not in pinned:
                evicted.append(key)
        return None if over() else evicted
