"""A finished request's numbers, as stage 0 sends them on its final TokenEvents.

Typed, so every process that reads them (the broker, the adapter's metrics and responses, the
benchmarks) names a field instead of a string key. `RequestStats.speculative` is set when the request
ran verify windows, `prefix_cache` when stage 0 keeps a prefix cache. Frozen msgspec Structs, like the
messages (`skippy.protocol.messages`): decoding checks each count is an int >= 0 and each rate finite;
`msgspec.structs.asdict` gives one as a plain dict.
"""

from __future__ import annotations

import msgspec

from skippy.protocol.kinds import U63, Finite

__all__ = ["PrefixStats", "RequestStats", "SpeculativeStats", "SPECULATIVE_COUNTS"]


class SpeculativeStats(msgspec.Struct, frozen=True):
    """A request's verify windows: early = the first draft rejected, tail = some accepted, then one rejected."""

    windows: U63 = 0
    proposed: U63 = 0  # draft tokens sent
    accepted: U63 = 0  # draft tokens the final stage accepted
    full_accepts: U63 = 0
    early_rejects: U63 = 0
    tail_rejects: U63 = 0
    stops: U63 = 0  # windows cut short by a stop token or the length limit, not by a rejection
    wasted_rows: U63 = 0  # rows computed, then thrown away: proposed - accepted
    alpha: Finite = 0.0  # the acceptance estimate at the end
    k_start: U63 = 0  # the window policy's k: first, last, smallest, largest
    k_last: U63 = 0
    k_min: U63 = 0
    k_max: U63 = 0
    proposer_calls: U63 = 0
    proposer_us_per_call: Finite = 0.0
    stale_windows: U63 = 0  # windows whose drafts were dropped because the session moved on
    stale_rows: U63 = 0
    accepted_per_pos: tuple[U63, ...] = ()  # [i]: windows whose draft i (from 0) was accepted


SPECULATIVE_COUNTS = ("windows", "proposed", "accepted", "full_accepts", "early_rejects", "tail_rejects", "stops",
                      "wasted_rows")  # the SpeculativeStats fields that sum over requests


class PrefixStats(msgspec.Struct, frozen=True):
    """A request's prefix cache outcome, with the cache's size on all stages together when it finished."""

    cached_tokens: U63 = 0  # prompt tokens restored instead of prefilled
    hit: bool = False
    lookup_miss: bool = False
    chain_misses: U63 = 0  # a stage lacked the restored entry: the prompt was prefilled from 0
    evictions: U63 = 0  # entries evicted since the previous request's numbers (each eviction counted once)
    entries: U63 = 0
    bytes: U63 = 0


class RequestStats(msgspec.Struct, frozen=True):
    """What stage 0 knows of a finished request: its verify windows and its prefix cache outcome, when it had them."""

    speculative: SpeculativeStats | None = None
    prefix_cache: PrefixStats | None = None
