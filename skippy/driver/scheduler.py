"""The iteration scheduler: which rows of which sessions go into the next micro-batch.

Each iteration takes, within a token budget (n_batch), one decode row for every running session
whose previous step has come back, then prefill chunks for sessions still prefilling (continuous
batching). Decode windows of sessions still in flight are skipped (only a chained verify window may
follow one), so the decode iterations in flight cover disjoint sessions; prefill chunks of one
prompt are pipelined. `max_decode_rows` splits the
decoding sessions into micro-batches so every stage has one to work on. Decode and verify windows keep within the
KV pool's cells left (`CellRoom`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from skippy.driver.sequence import Sequence


@dataclass(frozen=True)
class PlannedWindow:
    seq: Sequence
    pos_start: int
    tokens: np.ndarray
    outputs: tuple[int, ...]
    draft: tuple[int, ...] = ()  # a verify window: tokens[1:] are proposed, not committed
    head: int | None = None  # a chained verify window: tokens[0] guesses the previous window's bonus token
    epoch: int = 0  # the session's epoch when planned (a chained window of an older epoch is stale)
    next_guess: int | None = None  # the head of the window chained behind this one, if one may follow
    attempt: int = 0  # the session's prefill attempt when planned (see Sequence.attempt)

    @property
    def is_prefill(self) -> bool:
        return self.pos_start < len(self.seq.fill)


def decode_rows_per_iteration(n_running: int, iterations_in_flight: int) -> int:
    """Split decoding sessions evenly over the micro-batches kept in flight."""
    return max(1, math.ceil(n_running / max(1, iterations_in_flight)))


Drafter = Callable[[Sequence, int], list[int]]  # (session, rows left in the budget) -> draft tokens
Chainer = Callable[[Sequence, int], PlannedWindow | None]  # the next chained window of a session in flight


class CellRoom(Protocol):
    """The KV pool's cells left for the plan's windows (skippy.driver.cell_pool.CellPool)."""

    def room(self, seq: Sequence, pos_start: int) -> int: ...  # rows a window of `seq` at `pos_start` may have
    def take(self, seq: Sequence, end: int) -> None: ...  # a window of `seq` ending at `end` is planned


def plan_iteration(running: Iterable[Sequence], token_budget: int, max_decode_rows: int,
                   drafter: Drafter | None = None, chainer: Chainer | None = None, *,
                   only_pipelined_prefill: bool = False, cells: CellRoom | None = None) -> list[PlannedWindow]:
    """The next micro-batch: decode windows first, then prefill chunks, within `token_budget` rows.

    A decode window is the session's last sampled token at its next position; with a `drafter`
    it becomes a verify window `[last, d1..dk]` with an output on every row. A session whose window
    is in flight gets a chained verify window only from a `chainer` (pipelined verify windows).
    `only_pipelined_prefill`: no room for another micro-batch, so only the next chunks of prompts
    whose earlier chunks are in flight (no new prompts, no chained windows), with a decode row for each session
    whose last token is back: a long prompt streaming its chunks does not stall the sessions decoding beside it
    (between two of a session's rows at most one chunk's batch). `cells`: a decode or verify window
    keeps within the KV cells left (a session with none left gets no row; its drafts shrink to them).
    """
    running = list(running)
    plan: list[PlannedWindow] = []
    budget = token_budget
    # decode: one window per session whose last token is back; input = last sampled token (+ drafts)
    for seq in running:
        if budget == 0 or len(plan) >= max_decode_rows:
            break
        if seq.cancelled or seq.paused or seq.prefilling or not seq.generated or only_pipelined_prefill and seq.in_flight:
            continue
        rows = budget if cells is None else min(budget, cells.room(seq, seq.chain_pos if seq.in_flight else seq.length))
        if seq.in_flight:
            chained = chainer(seq, rows) if chainer is not None and rows > 0 else None
            if chained is not None:
                plan.append(chained)
                budget -= len(chained.tokens)
                if cells is not None:
                    cells.take(seq, chained.pos_start + len(chained.tokens))
            continue
        if rows < 1:  # no KV cell left for it: it waits (skippy.driver.cell_pool)
            continue
        draft = tuple(drafter(seq, rows)) if drafter is not None else ()
        tokens = np.array([seq.generated[-1], *draft], np.int32)
        next_guess = seq.chain[0] if draft and seq.chain else None
        plan.append(PlannedWindow(seq, seq.length, tokens, tuple(range(len(tokens))), draft, None, seq.epoch,
                                  next_guess, seq.attempt))
        budget -= len(tokens)
        if cells is not None:
            cells.take(seq, seq.length + len(tokens))
    # prefill: FIFO over sessions still prefilling; the last chunk asks for the first token. A chunk
    # needs nothing back from the one before it, so chunks of one prompt follow each other down the
    # pipeline without waiting (bounded by credits): chunk k+1 computes at stage 0 while k is at stage 1.
    for seq, n in prefill_chunks(running, budget, only_pipelined_prefill):
        end = seq.prefilled + n
        outputs = (n - 1,) if end == len(seq.fill) and not seq.replay_committed else ()
        plan.append(PlannedWindow(seq, seq.prefilled, seq.fill[seq.prefilled : end], outputs, epoch=seq.epoch,
                                  attempt=seq.attempt))
        if cells is not None:  # within the cells reserved at admission
            cells.take(seq, end)
    return plan


def prefill_chunks(running: Iterable[Sequence], budget: int,
                   only_pipelined_prefill: bool = False) -> Iterator[tuple[Sequence, int]]:
    """(session, rows) of the next prefill chunks within `budget` rows, FIFO over sessions still prefilling."""
    for seq in running:
        if budget == 0:
            break
        if seq.cancelled or seq.paused or not seq.prefilling or (only_pipelined_prefill and not seq.in_flight):
            continue
        # a chunk ends where the prompt is recorded in the prefix cache (entries are recorded at a window's end);
        # a replay's (prompt + committed tokens) last chunk samples nothing: the last committed token comes next
        size = seq.replay_chunk(seq.planner.size()) if seq.replay_committed else seq.planner.size()
        n = min(size, seq.prefix.chunk_end(seq.prefilled, len(seq.fill)) - seq.prefilled, budget)
        yield seq, n
        budget -= n
