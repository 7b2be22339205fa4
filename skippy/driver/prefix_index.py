"""Stage 0's prefix cache index: which prompt prefixes every stage keeps, and each window's cache operations.

Stage 0 is the authority; the stages only follow (`skippy.runtime.prefix_cache`). At admission
`admit` looks the prompt up: the entry sharing the longest prefix with the prompt, shorter than it (the
last prompt token must run to give the first token) and at least `min_tokens` long. The session then
starts at that position and its first window restores the entry's first positions on every stage. `admit`
also picks where the prompt is recorded: at its end, which serves every prompt sharing a prefix with it; where
a stage has sliding-window layers, whose entries are restored whole or all but the last position
(`CacheCaps.partial`), also at up to `shared_prefix_record_limit` multiples of `shared_prefix_stride_tokens` at
least one stride below it (prompts sharing a system prefix hit those; a conversation's next turn hits the end, so
no point near it splits its prefill); the scheduler ends prefill chunks there (an entry is recorded at the end of
a window). An entry whose tokens begin a new one's is superseded by it (restores may take its first positions).
When a batch is launched,
`window_ops` turns this into each window's restore / evict / record, in the order the stages apply
them, keeping the entries within the bounds every stage announced (`CacheCaps`: the fewest cells
and entries of any stage, cells counted by a `CellLedger` fed the same operations). The least recently
used entries are evicted first, never one a session is waiting to restore. Entries are kept outside the
KV pool (skippy.runtime.entry_states), so they never take cells from the lanes. A request that ends well
is kept once more when its session is released (`take_kept`, with the ReleaseSessions): its prompt
and reply, so a conversation's next turn, which repeats the reply, restores that too.

An entry's key hashes the model digest, the topology and its tokens; the index keeps the tokens and
compares them, so a collision cannot restore the wrong prefix. A stage that lacks an entry drops the
window; when that comes back (`Predictions.missed`) `chain_miss` restarts the request's prefill at
position 0 (positions are authoritative, so every stage trims the session), forgets the entries
involved on every stage and counts a chain miss.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from skippy.config import KvCacheConfig, ServingOptions
from skippy.driver.sequence import Sequence
from skippy.log import get_logger
from skippy.protocol import CacheCaps, KeptPrefix, PrefixRef
from skippy.protocol.stats import PrefixStats
from skippy.runtime.kv_ledger import CellLedger
from skippy.runtime.prefix_cache import chain_caps

if TYPE_CHECKING:
    from skippy.driver.scheduler import PlannedWindow
    from skippy.runtime.stage_runtime import StageRuntime

_KEY_MASK = 2**63 - 1


class Entry(NamedTuple):
    tokens: np.ndarray
    kind: str  # what was recorded: "prompt" (a prompt's end), "grid" (a shared-prefix grid point), "reply", "abandoned"


class CacheOps(NamedTuple):
    """One window's prefix cache operations (see skippy.protocol.Window)."""

    restore: PrefixRef | None = None
    record: tuple[PrefixRef, ...] = ()
    evict: tuple[int, ...] = ()


class PrefixIndex:
    def __init__(self, config: KvCacheConfig | None, identity: str, own: CacheCaps | None) -> None:
        self.config = config if config is not None and config.should_record else None
        self.identity = identity.encode()
        self.own = own
        self.caps: CacheCaps | None = own if self.config is not None else None
        self.ledger = CellLedger()
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._pins: Counter[int] = Counter()  # entries sessions wait to restore
        self._forgotten: list[int] = []  # dropped from the index, still to be evicted on the stages
        self._to_keep: list[tuple[int, np.ndarray, str]] = []  # finished sessions' prompt + reply, kept at release
        self.counters: Counter[str] = Counter()
        self._reported_evictions = 0

    @classmethod
    def for_stage0(cls, options: ServingOptions, runtime: StageRuntime) -> PrefixIndex:
        """Stage 0's index: its config's `kv_cache`, keys bound to the model, topology and layer ranges."""
        cfg, topology = options.config, options.topology
        ranges = [(s.layer_start, s.layer_end) for s in topology.stages] if topology is not None else []
        return cls(cfg.kv_cache, f"{runtime.model_digest}|{cfg.topology_id}|{ranges}",
                   runtime.prefix.caps if runtime.prefix is not None else None)

    @property
    def enabled(self) -> bool:
        return self.caps is not None

    @property
    def cells(self) -> int:
        return self.ledger.cells()

    def set_downstream(self, caps: CacheCaps | None) -> None:
        """The bounds the downstream stages announced (Ready.cache); None turns the cache off."""
        self.caps = chain_caps(self.own, caps, True) if self.config is not None else None

    def key(self, tokens: np.ndarray) -> int:
        digest = hashlib.blake2b(self.identity + b"\0" + tokens.astype("<i4").tobytes(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & _KEY_MASK

    # -- admission ----------------------------------------------------------------------------------
    def admit(self, seq: Sequence) -> None:
        """Look the prompt up (the session then starts at the restored position) and pick its record points."""
        if self.config is None or self.caps is None:
            return
        state, prompt = seq.prefix, seq.prompt
        state.status = "miss"
        if self.config.should_lookup:
            best, n = self.lookup(prompt)
            if best is not None:
                state.status, state.restore, state.matched = "hit", PrefixRef(best, n), n
                state.hit_kind = self._entries[best].kind
                self._pins[best] += 1
                seq.prefilled = n
                self.counters["hits"] += 1
                self.counters["cached_tokens"] += n
            else:
                self.counters["lookup_misses"] += 1
        state.points = self._points(prompt, state.matched)

    def lookup(self, prompt: np.ndarray) -> tuple[int | None, int]:
        """(key, n): the entry `admit` would restore for the prompt, and how many of its tokens ((None, 0): none)."""
        if self.config is None or self.caps is None or not self.config.should_lookup:
            return None, 0
        return self._longest_match(prompt)

    @property
    def evictions_pending(self) -> bool:
        return bool(self._forgotten)

    def _longest_match(self, prompt: np.ndarray) -> tuple[int | None, int]:
        """(key, n): the entry whose tokens share the longest prefix with the prompt, n >= min_tokens of them
        and at most all but the prompt's last token (it must run to give logits); a restore copies the
        entry's first n positions (their KV depends on those tokens only); where a stage has sliding-window
        layers only all of it or all but its last position (`CacheCaps.partial`). The most recent wins a tie."""
        assert self.config is not None
        best, best_n, limit = None, 0, len(prompt) - 1
        whole = self.caps is not None and not self.caps.partial  # sliding-window layers: whole entries only
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), limit)
            same = entry.tokens[:n] == prompt[:n]
            shared = n if same.all() else int(np.argmin(same))
            if whole and shared < len(entry.tokens) - 1:  # all of it or all but its last position
                continue
            if shared >= max(best_n, self.config.min_tokens, 1):
                best, best_n = key, shared
        return best, best_n

    def _points(self, prompt: np.ndarray, start: int) -> tuple[int, ...]:
        """The prompt's end and, where restores take whole entries only, its grid points: the largest multiples of
        the stride at least one stride below the end (a point closer to it would serve little the exact end does
        not, and cost a chunk)."""
        assert self.config is not None
        stride, n = self.config.shared_prefix_stride_tokens, len(prompt)
        # a restore may take any first positions of an entry, so the end serves every shorter prefix (but not with
        # sliding-window layers: `CacheCaps.partial`)
        limit = 0 if self.caps is None or self.caps.partial else self.config.shared_prefix_record_limit
        grid = [((n - stride) // stride - i) * stride for i in range(limit)]
        points = {p for p in (n, *grid) if p > start and p >= self.config.min_tokens}
        return tuple(sorted(p for p in points if self.key(prompt[:p]) not in self._entries))

    # -- a batch ------------------------------------------------------------------------------------
    def window_ops(self, plan: list[PlannedWindow]) -> list[CacheOps]:
        """Each window's operations, in the stages' order: restores; the decode; per window, evictions
        then records."""
        if self.caps is None:
            return [CacheOps() for _ in plan]
        restores = [self._take_restore(pw) for pw in plan]
        for pw in plan:
            self.ledger.write(pw.seq.session_id, pw.pos_start, len(pw.tokens))
        ops = []
        for i, (pw, restore) in enumerate(zip(plan, restores)):
            evict: list[int] = []
            if i == 0:  # entries forgotten after a chain miss go with the first window
                evict, self._forgotten = self._forgotten, []
                for key in evict:
                    self.ledger.evict(key)
            record = self._record(pw, evict)
            ops.append(CacheOps(restore, () if record is None else (record,), tuple(evict)))
        return ops

    def _take_restore(self, pw: PlannedWindow) -> PrefixRef | None:
        state = pw.seq.prefix
        ref = state.restore
        if ref is None or pw.pos_start != ref.n_tokens:
            return None
        state.restore, state.restored = None, ref.key
        self._unpin(ref.key)
        if ref.key in self._entries:
            self._entries.move_to_end(ref.key)
        self.ledger.restore(pw.seq.session_id, ref.key, ref.n_tokens)
        return ref

    def _record(self, pw: PlannedWindow, evict: list[int]) -> PrefixRef | None:
        seq, end = pw.seq, pw.pos_start + len(pw.tokens)
        if not pw.is_prefill or pw.attempt != seq.attempt or end not in seq.prefix.points:
            return None
        return self._record_prefix(seq.session_id, seq.prompt[:end], evict, seq)

    def _record_prefix(self, session: int, tokens: np.ndarray, evict: list[int], seq: Sequence | None,
                       kept: str = "reply") -> PrefixRef | None:
        """Record the session's first len(tokens) positions if the bounds allow (evicting into `evict`);
        `seq` when a prefill window records it, None when a finished request's are kept (`kept`: the kind)."""
        assert self.caps is not None
        key, end = self.key(tokens), len(tokens)
        if key in self._entries or end < (self.config.min_tokens if self.config else 0):
            return None  # already kept (another session recorded it meanwhile), or too short
        # an entry whose tokens begin these is kept whole by the new one (a restore takes any first n of an entry)
        contained = [k for k, e in self._entries.items() if self.caps.partial and k not in self._pins
                     and len(e.tokens) < end and np.array_equal(e.tokens, tokens[:len(e.tokens)])]
        for old in contained:
            del self._entries[old]
            self.ledger.evict(old)
            evict.append(old)
        self.counters["superseded"] += len(contained)
        fit = self.ledger.fit(end, list(self._entries), self.caps.entries, self.caps.cells, self._pins)
        if fit is None:
            self.counters["unfit"] += 1
            return None
        for old in fit:
            del self._entries[old]
            self.ledger.evict(old)
            evict.append(old)
        self.counters["evictions"] += len(fit)
        self.ledger.record(session, key, end)
        kind = kept if seq is None else "prompt" if end == len(seq.prompt) else "grid"
        self._entries[key] = Entry(tokens.copy(), kind)
        if seq is not None:
            seq.prefix.evictions += len(fit)
            seq.prefix.recorded.append(key)
        self.counters["records"] += 1
        return PrefixRef(key, end)

    # -- outcomes -----------------------------------------------------------------------------------
    def chain_miss(self, seq: Sequence) -> None:
        """A stage lacked an entry this request restored: prefill it again from position 0, forgetting
        the entries this attempt used or made (some stage does not have them)."""
        state = seq.prefix
        self._forget([k for k in (state.restored, *state.recorded) if k is not None])
        if state.restore is not None:
            self._unpin(state.restore.key)
        state.status, state.restore, state.restored, state.matched, state.recorded = "chain_miss", None, None, 0, []
        state.hit_kind = None
        state.chain_misses += 1
        self.counters["chain_misses"] += 1
        get_logger().warning("prefix_chain_miss", request_id=seq.request_id, session_id=seq.session_id)
        seq.attempt += 1
        seq.prefilled = 0
        state.points = self._points(seq.prompt, 0)

    def finish(self, seq: Sequence, keep: bool) -> None:
        """The request ended; a restore it never launched no longer pins its entry. With `keep` (it
        ended well) its prompt and reply are kept when it is released, if its KV holds exactly them
        (not after a verify window's rejected drafts): the conversation's next turn restores the reply too.
        One cancelled while it prefilled (its client gave up on a long prompt) keeps what it prefilled (kind
        "abandoned"), once nothing of it is in flight: the same prompt sent again goes on from there."""
        if seq.prefix.restore is not None:
            self._unpin(seq.prefix.restore.key)
            seq.prefix.restore = None
        holds = self.ledger.holds(seq.session_id)
        n = len(seq.prompt) + len(seq.generated) - 1
        if keep and self.caps is not None and n > len(seq.prompt) and holds == n and not seq.in_flight:
            self._to_keep.append((seq.session_id, np.concatenate([seq.prompt, np.asarray(seq.generated[:-1], np.int32)]),
                                  "reply"))
        elif (seq.cancelled and seq.prefilling and self.caps is not None and not seq.in_flight
              and holds == seq.prefilled > seq.prefix.matched):
            self._to_keep.append((seq.session_id, seq.fill[:seq.prefilled].copy(), "abandoned"))

    def take_kept(self) -> tuple[tuple[KeptPrefix, ...], tuple[int, ...]]:
        """What the next ReleaseSessions keeps and evicts (decided now: the stages apply it in this order)."""
        kept, evict = [], list(self._forgotten)
        self._forgotten = []
        for key in evict:
            self.ledger.evict(key)
        for session, tokens, kind in self._to_keep:
            ref = self._record_prefix(session, tokens, evict, None, kind)
            if ref is not None:
                kept.append(KeptPrefix(session, ref))
        self._to_keep = []
        return tuple(kept), tuple(evict)

    def release(self, session_ids: Iterable[int]) -> None:
        for sid in session_ids:
            self.ledger.release(sid)

    def clear(self) -> None:
        """Every stage forgets its entries (a new handshake): so does the index."""
        self._entries.clear()
        self._pins.clear()
        self._forgotten = []
        self.ledger.clear_entries()

    def _forget(self, keys: Iterable[int]) -> None:
        for key in keys:
            if self._entries.pop(key, None) is not None:
                self._forgotten.append(key)

    def _unpin(self, key: int) -> None:
        self._pins[key] -= 1
        if self._pins[key] <= 0:
            del self._pins[key]

    def stats(self, seq: Sequence) -> PrefixStats | None:
        """A request's prefix cache numbers for its client (TokenEvents.stats), with the cache's size now and
        the evictions since the last request's numbers (summed over requests: every eviction once)."""
        if seq.prefix.status == "disabled":
            return None
        now = self.snapshot()
        evicted, self._reported_evictions = now["evictions"] - self._reported_evictions, now["evictions"]
        return seq.prefix.stats(evicted, now["entries"], now["bytes"])

    def snapshot(self) -> dict[str, int]:
        """Counters, entries and the bytes they hold on all stages together (for logs and stats)."""
        cell_bytes = self.caps.cell_bytes if self.caps is not None else 0
        return {"hits": 0, "lookup_misses": 0, "chain_misses": 0, "records": 0, "evictions": 0, **self.counters,
                "entries": len(self._entries), "cells": self.cells, "bytes": self.cells * cell_bytes}
