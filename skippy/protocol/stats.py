"""A finished request's numbers, as stage 0 sends them on its final TokenEvents.

Typed, so every process that reads them (the broker, the adapter's metrics and responses, the
benchmarks) names a field instead of a string key. `RequestStats.speculative` is set when the request
ran verify windows, `prefix_cache` when stage 0 keeps a prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PrefixStats", "RequestStats", "SpeculativeStats", "SPECULATIVE_COUNTS"]


@dataclass(frozen=True)
class SpeculativeStats:
    """A request's verify windows: early = the first draft rejected, tail = some accepted, then one rejected."""

    windows: int = 0
    proposed: int = 0  # draft tokens sent
    accepted: int = 0  # draft tokens the final stage accepted
    full_accepts: int = 0
    early_rejects: int = 0
    tail_rejects: int = 0
    stops: int = 0  # windows cut short by a stop token or the length limit, not by a rejection
    wasted_rows: int = 0  # rows computed, then thrown away: proposed - accepted
    alpha: float = 0.0  # the acceptance estimate at the end
    k_start: int = 0  # the window policy's k: first, last, smallest, largest
    k_last: int = 0
    k_min: int = 0
    k_max: int = 0
    proposer_calls: int = 0
    proposer_us_per_call: float = 0.0
    stale_windows: int = 0  # windows whose drafts were dropped because the session moved on
    stale_rows: int = 0


SPECULATIVE_COUNTS = ("windows", "proposed", "accepted", "full_accepts", "early_rejects", "tail_rejects", "stops",
                      "wasted_rows")  # the SpeculativeStats fields that sum over requests


@dataclass(frozen=True)
class PrefixStats:
    """A request's prefix cache outcome, with the cache's size on all stages together when it finished."""

    cached_tokens: int = 0  # prompt tokens restored instead of prefilled
    hit: bool = False
    lookup_miss: bool = False
    chain_misses: int = 0  # a stage lacked the restored entry: the prompt was prefilled from 0
    evictions: int = 0  # entries evicted since the previous request's numbers (each eviction counted once)
    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class RequestStats:
    speculative: SpeculativeStats | None = None
    prefix_cache: PrefixStats | None = None
