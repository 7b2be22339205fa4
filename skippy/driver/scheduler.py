"""The iteration scheduler: which rows of which sessions go into the next micro-batch.

Each iteration takes, within a token budget (n_batch), one decode row for every running session
whose previous step has come back, then prefill chunks for sessions still prefilling (continuous
batching). Sessions in an iteration still in flight are skipped, so the iterations kept in flight
at once (one per stage, bounded by credits) cover disjoint sessions. `max_decode_rows` splits the
decoding sessions into micro-batches so every stage has one to work on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from skippy.driver.sequence import Sequence


@dataclass(frozen=True)
class PlannedWindow:
    seq: Sequence
    pos_start: int
    tokens: np.ndarray
    outputs: tuple[int, ...]
    draft: tuple[int, ...] = ()  # a verify window: tokens[1:] are proposed, not committed

    @property
    def is_prefill(self) -> bool:
        return self.pos_start < len(self.seq.prompt)


def decode_rows_per_iteration(n_running: int, iterations_in_flight: int) -> int:
    """Split decoding sessions evenly over the micro-batches kept in flight."""
    return max(1, math.ceil(n_running / max(1, iterations_in_flight)))


Drafter = Callable[[Sequence, int], list[int]]  # (session, rows left in the budget) -> draft tokens


def plan_iteration(running: Iterable[Sequence], token_budget: int, max_decode_rows: int,
                   drafter: Drafter | None = None) -> list[PlannedWindow]:
    """The next micro-batch: decode windows first, then prefill chunks, within `token_budget` rows.

    A decode window is the session's last sampled token at its next position; with a `drafter`
    it becomes a verify window `[last, d1..dk]` with an output on every row.
    """
    running = list(running)
    plan: list[PlannedWindow] = []
    budget = token_budget
    # decode: one window per session whose last token is back; input = last sampled token (+ drafts)
    for seq in running:
        if budget == 0 or len(plan) >= max_decode_rows:
            break
        if seq.in_flight or seq.cancelled or seq.prefilling or not seq.generated:
            continue
        draft = tuple(drafter(seq, budget)) if drafter is not None else ()
        tokens = np.array([seq.generated[-1], *draft], np.int32)
        plan.append(PlannedWindow(seq, seq.length, tokens, tuple(range(len(tokens))), draft))
        budget -= len(tokens)
    # prefill: FIFO over sessions still prefilling; the last chunk asks for the first token
    for seq in running:
        if budget == 0:
            break
        if seq.in_flight or seq.cancelled or not seq.prefilling:
            continue
        n = min(seq.planner.size(), len(seq.prompt) - seq.prefilled, budget)
        end = seq.prefilled + n
        outputs = (n - 1,) if end == len(seq.prompt) else ()
        plan.append(PlannedWindow(seq, seq.prefilled, seq.prompt[seq.prefilled : end], outputs))
        budget -= n
    return plan
