"""The KV cells sessions and prefix cache entries hold, counted without asking llama.cpp.

A prefix cache entry is a copy of a session's positions [0, n) kept outside the KV pool
(skippy.runtime.entry_states): recording copies the session's cells out, restoring copies them back
into new cells of the session's lane. So an entry holds `n` cells' bytes of its own, shared with
nothing, and a session holds its positions [0, end).

`CellLedger` follows every operation that changes what a session or an entry holds (a window written
at `pos_start`, which first trims the session there; releases; restores; records; evictions). Stage 0's
index and every stage keep one and apply the same operations in the same order, so they agree on the
cells the entries hold, which their bounds (`max_cells`, `max_entries`) limit.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


class CellLedger:
    def __init__(self) -> None:
        self.sessions: dict[int, int] = {}  # session -> the end of the positions its lane holds
        self.entries: dict[int, int] = {}  # entry key -> the positions its copy holds

    def write(self, session: int, pos_start: int, n_tokens: int) -> None:
        """A window of `n_tokens` rows at `pos_start` (the session is trimmed there first)."""
        self.sessions[session] = pos_start + n_tokens

    def release(self, session: int) -> None:
        self.sessions.pop(session, None)

    def restore(self, session: int, key: int, n_tokens: int) -> None:
        """The session's lane emptied and the entry's first `n_tokens` positions copied into it."""
        self.sessions[session] = n_tokens

    def record(self, session: int, key: int, n_tokens: int) -> None:
        self.entries[key] = n_tokens

    def holds(self, session: int) -> int:
        """The end of the positions the session's lane holds (0: none)."""
        return self.sessions.get(session, 0)

    def evict(self, key: int) -> None:
        self.entries.pop(key, None)

    def clear_entries(self) -> None:
        self.entries.clear()

    def cells(self, without: Collection[int] = (), extra: int = 0) -> int:
        """Cells held by the entries (except `without`, plus an entry of `extra` cells to be)."""
        return sum(n for key, n in self.entries.items() if key not in without) + extra

    def fit(self, n_tokens: int, lru: Iterable[int], max_entries: int, max_cells: int,
            pinned: Collection[int] = ()) -> list[int] | None:
        """Entries to evict, least recently used first and never a pinned one, so that the entries
        plus one more of `n_tokens` cells stay within `max_entries` and `max_cells`; None if they cannot."""
        evicted: list[int] = []

        def over() -> bool:
            return len(self.entries) - len(evicted) + 1 > max_entries or self.cells(evicted, n_tokens) > max_cells

        for key in lru:
            if not over():
                break
            if key not in pinned:
                evicted.append(key)
        return None if over() else evicted
