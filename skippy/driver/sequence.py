"""Requests at stage 0: a `Sequence` per request and the `SequenceTable` that owns them all.

A sequence is WAITING (submitted, no lane yet; or preempted: it gave its KV cells back and waits to replay),
RUNNING (admitted: holds a session on every stage) or FINISHED (gone from the table). Only the table changes
that state, so the queues, the request-id index and the releases owed to the stages cannot drift apart.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skippy.driver.prefill import ChunkPlanner
from skippy.protocol import ErrorCode, FinishReason, PrefixRef, ResumePoint, StageTiming, TokenEvents
from skippy.protocol.stats import PrefixStats, RequestStats
from skippy.request_events import RequestHandle
from skippy.runtime.sampling import SamplingParams


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class PrefixState:
    """A request's prefix cache state: what it restores and records, and what happened."""

    status: str = "disabled"  # disabled | miss | hit | chain_miss (a stage lacked the entry: full prefill)
    hit_kind: str | None = None  # the restored entry's kind (skippy.driver.prefix_index.Entry.kind)
    restore: PrefixRef | None = None  # restored by the session's next window
    restored: int | None = None  # the key this attempt restored
    matched: int = 0  # prompt tokens restored instead of prefilled
    points: tuple[int, ...] = ()  # prompt lengths recorded at the end of the window that reaches them
    recorded: list[int] = field(default_factory=list)  # keys recorded by this attempt
    chain_misses: int = 0
    evictions: int = 0  # entries evicted to make room for this request's prefill records

    def chunk_end(self, prefilled: int, prompt_len: int) -> int:
        """Where the next prefill chunk must end at the latest: the next record point, else the prompt's end."""
        return next((p for p in self.points if p > prefilled), prompt_len)

    def summary(self, prompt_len: int) -> dict[str, Any]:
        return {"kv_status": self.status, "hit_kind": self.hit_kind, "cached_prompt_tokens": self.matched,
                "matched_prefix_tokens": self.matched,
                "suffix_prefill_tokens": prompt_len - self.matched, "chain_misses": self.chain_misses,
                "prefix_evictions": self.evictions}

    def stats(self, evictions: int, entries: int, nbytes: int) -> PrefixStats:
        """This request's outcome, with the cache's evictions since the last report and its size now."""
        return PrefixStats(cached_tokens=self.matched, hit=self.matched > 0, lookup_miss=self.status == "miss",
                           chain_misses=self.chain_misses, evictions=evictions, entries=entries, bytes=nbytes)


@dataclass(frozen=True)
class Paused:
    """Why and since when (perf_counter) a session waits for the chain to come back."""

    stage_id: str
    since: float
    reason: str = ""  # what stage 0 was told or saw (stage_stopped, silence, a restart)


@dataclass(eq=False)
class Sequence:
    """One request: its session on every stage, progress, and timings."""

    request_id: str
    session_id: int
    prompt: np.ndarray  # int32 token ids
    sampling: SamplingParams
    max_tokens: int
    stop_tokens: frozenset[int]
    planner: ChunkPlanner
    handle: RequestHandle
    state: SeqState = SeqState.WAITING
    prefilled: int = 0  # prompt positions sent through stage 0
    generated: list[int] = field(default_factory=list)
    in_flight: int = 0  # windows of this session in flight (more than 1 only for chained verify windows)
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None
    first_token_at: float | None = None
    stage_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> compute/credit_wait
    # prefill positions back through every stage, and each stage's compute (ms) on the batches that carried them
    prefill_rows: int = 0
    prefill_stage_ms: dict[str, float] = field(default_factory=dict)
    # pipelined verify windows: drafts proposed beyond the windows in flight, and where they start
    chain: list[int] = field(default_factory=list)  # chain[0] guesses the last window's bonus token
    chain_pos: int = 0
    chain_k: int = 0  # drafts per chained window
    epoch: int = 0  # bumped when a window breaks the chain: older chained windows are stale
    prefix: PrefixState = field(default_factory=PrefixState)  # prefix cache: restored, recorded, outcome
    attempt: int = 0  # bumped when a prefill restarts at 0 (a chain miss, a replay): older windows are ignored
    # a replay (a later stage died): the prompt and all committed tokens but the last are prefilled again
    fill: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # what is prefilled: the prompt, or more
    replay_committed: int = 0  # committed tokens when a replay's `fill` was built (0: the last chunk samples the first)
    progress: bool = False  # send PromptProgress events as prefill chunks come back (Submit.progress)
    draws: int = 0  # the final stage's RNG draws for this session, as of the last committed window
    paused: Paused | None = None  # set while the chain is down: nothing of this session runs
    replays: int = 0
    preempted: int = 0  # times it gave its KV cells back to the pool (skippy.driver.cell_pool)
    chunk_ends: list[int] = field(default_factory=list)  # where this attempt's prompt chunks ended (a replay repeats them)

    def __post_init__(self) -> None:
        self.fill = self.prompt

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.fill)

    @property
    def length(self) -> int:
        """Positions this session occupies in KV once its last step is done."""
        return self.prefilled + max(0, len(self.generated) - 1 - (len(self.fill) - len(self.prompt)))

    def replay(self) -> int:
        """Prefill again from position 0 (every stage lost this session): the prompt and all committed
        tokens but the last, which drives the next decode row. Returns the committed tokens replayed."""
        self.attempt += 1
        self.in_flight, self.prefilled, self.paused = 0, 0, None
        self.epoch, self.chain = self.epoch + 1, []
        self.replay_committed = len(self.generated)
        replayed = max(0, self.replay_committed - 1)
        self.fill = np.concatenate([self.prompt, np.asarray(self.generated[:replayed], np.int32)])
        self.replays += 1
        return replayed

    def replay_from(self, point: ResumePoint) -> None:
        """Replay a request submitted from `point` (its first stage 0 or broker died): its prompt and the point's
        history prefilled again in the chunks its prompt first ran in, then decoding the next token."""
        self.generated[:] = point.history
        self.chunk_ends[:] = [e for e in point.chunk_ends if 0 < e <= len(self.prompt)]
        self.draws = point.draws
        self.replay()

    def replay_chunk(self, size: int) -> int:
        """A replay's next chunk: the prompt's in the chunks it first ran in, then one committed token per window,
        as they were decoded (llama.cpp is not batch-invariant: other chunks would give other bits of KV)."""
        end = next((e for e in self.chunk_ends if e > self.prefilled), None)
        return (end - self.prefilled) if end is not None and end <= len(self.prompt) else min(size, 1)

    def add_timings(self, timings: tuple[StageTiming, ...]) -> None:
        for t in timings:
            acc = self.stage_ms.setdefault(t.stage_id, {"compute_ms": 0.0, "credit_wait_ms": 0.0})
            acc["compute_ms"] += t.compute_ms
            acc["credit_wait_ms"] += t.credit_wait_ms

    def add_prefill(self, rows: int, timings: tuple[StageTiming, ...]) -> None:
        """A batch carrying `rows` of this prompt's prefill came back: its full compute counts on every stage."""
        self.prefill_rows += rows
        for t in timings:
            self.prefill_stage_ms[t.stage_id] = self.prefill_stage_ms.get(t.stage_id, 0.0) + t.compute_ms

    def prefill_rates(self) -> dict[str, float]:
        """Each stage's prefill tokens/s on the batches that carried this prompt (stages with compute so far)."""
        return {stage: self.prefill_rows / (ms / 1e3) for stage, ms in self.prefill_stage_ms.items() if ms > 0}

    def summary(self, reason: FinishReason, error: str | None) -> dict[str, Any]:
        """The `request_done` log line's fields."""
        now = time.perf_counter()
        first = self.first_token_at or now
        return dict(
            request_id=self.request_id, session_id=self.session_id, finish_reason=reason, error=error,
            prompt_tokens=len(self.prompt), generated_tokens=len(self.generated),
            ttft_ms=round((first - self.submitted_at) * 1e3, 3),
            prefill_ms=round((first - (self.admitted_at or self.submitted_at)) * 1e3, 3),
            decode_ms=round((now - first) * 1e3, 3),
            stages={k: {m: round(v, 3) for m, v in d.items()} for k, d in self.stage_ms.items()},
            **self.prefix.summary(len(self.prompt)),
        )


class SequenceTable:
    def __init__(self) -> None:
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_request: dict[str, Sequence] = {}
        self._releases: list[int] = []

    def __len__(self) -> int:
        return len(self._by_request)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_request.get(request_id)

    def live(self) -> list[Sequence]:
        return list(self._by_request.values())

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._by_request:
            raise ValueError(f"request id {seq.request_id!r} is already in flight")
        self._by_request[seq.request_id] = seq
        self.waiting.append(seq)

    def admit(self, lanes: int, fits: Callable[[Sequence], bool] = lambda seq: True) -> list[Sequence]:
        """Move waiting sequences (FIFO) to running while lanes are free and the next `fits` (its KV cells are
        free: nothing overtakes it); returns the admitted."""
        admitted = []
        while self.waiting and len(self.running) < lanes and fits(self.waiting[0]):
            seq = self.waiting.popleft()
            seq.state, seq.admitted_at = SeqState.RUNNING, time.perf_counter()
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def preempt(self, seq: Sequence) -> None:
        """A running sequence gives its KV cells back: its session is released on every stage and it waits again,
        first in line (it prefills again from position 0 once admitted: `Sequence.replay`)."""
        self.running.remove(seq)
        self._releases.append(seq.session_id)
        seq.state = SeqState.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: FinishReason, error: str | None = None,
               code: ErrorCode | None = None, stats: RequestStats | None = None) -> bool:
        """End a live sequence: final event to its client, its session owed a release if it had one.
        False when it had already finished."""
        if seq.state is SeqState.FINISHED:
            return False
        if seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            self._releases.append(seq.session_id)
        seq.state = SeqState.FINISHED
        del self._by_request[seq.request_id]
        seq.handle.put(TokenEvents(seq.request_id, (), reason, error, code, stats=stats))
        return True

    def take_releases(self) -> tuple[int, ...]:
        """Sessions finished since the last call: they must be released on every stage."""
        ids, self._releases = tuple(self._releases), []
        return ids

