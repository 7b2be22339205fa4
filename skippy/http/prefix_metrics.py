"""Prefix cache metrics of the HTTP adapter, from the numbers stage 0 sends with each finished request.

Counters summed over requests: hits (a prompt restored from the cache), lookup misses, chain misses
(a stage lacked an entry: prefilled from 0), evictions and cached prompt tokens; gauges: the entries
and the bytes they hold on all stages together, as of the last finished request. A request's own
share is `usage.prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

COUNTS = {"hits": "prefix_cache_hit", "lookup_misses": "prefix_cache_lookup_miss",
          "chain_misses": "prefix_cache_chain_misses", "evictions": "prefix_cache_evictions",
          "cached_tokens": "prefix_cache_cached_tokens"}
GAUGES = {"entries": "prefix_cache_entries", "bytes": "prefix_cache_bytes"}


class PrefixCacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts = {name: Counter(f"skippy_prefix_cache_{name}", f"prefix cache {name.replace('_', ' ')},"
                                     " summed over requests", registry=registry) for name in COUNTS}
        self.gauges = {name: Gauge(f"skippy_prefix_cache_{name}", f"prefix cache {name} on all stages together"
                                   " (as of the last finished request)", registry=registry) for name in GAUGES}

    def observe(self, stats: Mapping[str, float]) -> None:
        """A finished request's prefix cache numbers (none when the cache is off)."""
        if GAUGES["bytes"] not in stats:
            return
        for name, key in COUNTS.items():
            if stats.get(key, 0) > 0:
                self.counts[name].inc(stats[key])
        for name, key in GAUGES.items():
            self.gauges[name].set(stats[key])


def cached_tokens(stats: Mapping[str, float]) -> int:
    return int(stats.get(COUNTS["cached_tokens"], 0))
