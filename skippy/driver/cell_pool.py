"""Stage 0's account of the KV pool: the cells every stage's lanes share.

Every stage applies the same windows and releases in the same order, so stage 0 knows what each holds, as an
upper bound: a session holds `held` cells, the high-water mark of the windows planned for it (a verify window's
rejected drafts are overwritten by its next window, never more). Prefix cache entries are kept outside the pool
(skippy.runtime.entry_states; a restore copies an entry into the session's own cells). Keeping the sessions'
cells within the pool at every step keeps every stage's llama.cpp context from running out of cells.

- Admission (`admits`): the first waiting request gets a free lane once the cells it needs are free: its fill
  (the prompt, or a replay's prompt and committed tokens, the prefix it restores included), its first generated
  token and a cushion of the tokens it may generate next (at most 1/CUSHION_SHARE of a context). Until then it
  waits, and nothing behind it overtakes it. The cushion keeps a request admitted into a nearly full pool (or a
  preempted one let back in) from taking at once what the running ones grow into.
- Growth: before each plan `make_room` gives every session ready to decode room for one more token, oldest
  first; the plan's windows stay within what is left (`room`, `take`: drafts and chained windows shrink to it;
  prefill chunks stay within what admission reserved).
- Pressure: the youngest sessions younger than the one that must grow are preempted, if none of their windows is
  in flight: released on every stage and put back first in line, to prefill their prompt and committed tokens
  again when admitted (`Sequence.replay`: no token is lost or emitted twice; their sampler state goes along, as a
  replay after a stage died). A session that cannot grow now waits for the windows in flight. The pool holds at
  least one context, so the oldest session always grows in the end. The driver flushes the releases before it
  launches the plan: at every stage they precede the windows that use the cells.
Under `--deterministic` every lane has a context of its own (`shared` False): a lane is all a request needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from skippy.driver.prefix_index import PrefixIndex
from skippy.driver.sequence import Sequence, SequenceTable

__all__ = ["CellPool"]

UNBOUNDED = 1 << 40
CUSHION_SHARE = 16  # an admitted request's cushion for the tokens it generates next: at most 1/16 of a context


class CellPool:
    def __init__(self, cells: int, ctx_size: int, *, shared: bool, table: SequenceTable, prefix: PrefixIndex,
                 log: Any, on_preempt: Callable[[], None] = lambda: None) -> None:
        self.cells = cells
        self.ctx_size = ctx_size
        self.shared = shared
        self.table = table
        self.prefix = prefix
        self.log = log
        self.on_preempt = on_preempt
        self.held: dict[int, int] = {}  # session -> cells it may hold (until its release is flushed)
        self._left = 0  # cells the plan being made may still take (set by `make_room`)
        self._told: set[str] = set()  # requests logged as waiting for cells

    def used(self) -> int:
        return sum(self.held.values())

    def free(self) -> int:
        return self.cells - self.used() if self.shared else UNBOUNDED

    # -- admission ----------------------------------------------------------------------------------
    def admits(self, seq: Sequence) -> bool:
        """Whether `seq` may take a lane now; if so its cells are reserved."""
        cushion = max(0, min(seq.max_tokens - len(seq.generated) - 1, self.ctx_size // CUSHION_SHARE))
        need = min(self.ctx_size, len(seq.fill) + 1 + cushion)
        if self.shared:
            free = self.free()
            if need > free:
                if seq.request_id not in self._told:
                    self._told.add(seq.request_id)
                    self.log.info("request_waits_for_kv", request_id=seq.request_id, cells_needed=need,
                                  cells_free=free, kv_pool_cells=self.cells)
                return False
        self._told.discard(seq.request_id)
        self.held[seq.session_id] = need
        return True

    def admitted(self, seq: Sequence) -> None:
        """`seq` took a lane: its prefix looked up; a preempted one replays its prompt and tokens as they ran,
        restoring nothing."""
        if not seq.preempted:
            self.prefix.admit(seq)

    # -- growth -------------------------------------------------------------------------------------
    def make_room(self) -> None:
        """Before a plan: room for one more token for every session ready to decode, oldest first (see the module
        docstring); what is left is the plan's (`room`, `take`)."""
        if not self.shared:
            self._left = UNBOUNDED
            return
        running = list(self.table.running)
        free = self.free()
        for i, seq in enumerate(running):
            if seq not in self.table.running or not _ready_to_decode(seq):
                continue
            need = seq.length + 1 - self.held.get(seq.session_id, 0)
            if need <= 0:
                continue
            if need > free:  # the idle younger ones could give theirs (else it waits for the windows in flight)
                idle = [v for v in reversed(running[i + 1:]) if v in self.table.running and not v.in_flight]
                spare = sum(self.held.get(v.session_id, 0) for v in idle)
                for victim in idle if free + spare >= need else ():  # the youngest first
                    if free >= need:
                        break
                    self._preempt(victim)
                    free = self.free()
            if need <= free:
                self._reserve(seq, seq.length + 1)
                free -= need
        self._left = free

    def room(self, seq: Sequence, pos_start: int) -> int:
        """Rows a window of `seq` starting at `pos_start` may have in this plan."""
        return self.held.get(seq.session_id, 0) + self._left - pos_start

    def take(self, seq: Sequence, end: int) -> None:
        """A window of `seq` ending at `end` is planned (its first: the restore is done)."""
        self._left -= max(0, end - self.held.get(seq.session_id, 0))
        self._reserve(seq, end)

    def _reserve(self, seq: Sequence, end: int) -> None:
        sid = seq.session_id
        self.held[sid] = max(self.held.get(sid, 0), end)

    def _preempt(self, seq: Sequence) -> None:
        self.prefix.finish(seq, keep=False)  # a restore it never launched no longer pins its entry
        replayed = seq.replay()
        seq.prefix.points = ()  # a replay records nothing (its fill is more than the prompt)
        seq.preempted += 1
        self.table.preempt(seq)
        # its release goes out before any window that uses its cells: they count as free now, and the entries
        # sharing them as holding them alone
        self.forget((seq.session_id,))
        self.prefix.release((seq.session_id,))
        self.on_preempt()
        self.log.info("request_preempted", request_id=seq.request_id, session_id=seq.session_id,
                      generated_tokens=len(seq.generated), replayed_tokens=len(seq.fill), replayed_committed=replayed,
                      cells_free=self.free(), kv_pool_cells=self.cells)

    def forget(self, session_ids: Iterable[int]) -> None:
        """These sessions hold no cells any more (released, or about to be before any later window)."""
        for sid in session_ids:
            self.held.pop(sid, None)


def _ready_to_decode(seq: Sequence) -> bool:
    """What `plan_iteration` gives a decode row next."""
    return not (seq.cancelled or seq.paused or seq.prefilling or not seq.generated or seq.in_flight)
