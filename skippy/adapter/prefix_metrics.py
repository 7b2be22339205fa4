"""Prefix cache metrics of the HTTP adapter, from the numbers stage 0 sends with each finished request.

Counters summed over requests: hits (a prompt restored from the cache), lookup misses, chain misses
(a stage lacked an entry: prefilled from 0), evictions and cached prompt tokens; gauges: the entries
and the bytes they hold on all stages together, as of the last finished request. A request's own
share is `usage.prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from skippy.protocol.stats import PrefixStats

COUNTS = {"hits": "hit", "lookup_misses": "lookup_miss", "chain_misses": "chain_misses", "evictions": "evictions",
          "cached_tokens": "cached_tokens"}  # metric -> PrefixStats field
GAUGES = {"entries": "entries", "bytes": "bytes"}


class PrefixCacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts = {name: Counter(f"skippy_prefix_cache_{name}", f"prefix cache {name.replace('_', ' ')},"
                                     " summed over requests", registry=registry) for name in COUNTS}
        self.gauges = {name: Gauge(f"skippy_prefix_cache_{name}", f"prefix cache {name} on all stages together"
                                   " (as of the last finished request)", registry=registry) for name in GAUGES}

    def observe(self, stats: PrefixStats) -> None:
        """A finished request's prefix cache numbers."""
        for name, key in COUNTS.items():
            value = float(getattr(stats, key))
            if value > 0:
                self.counts[name].inc(value)
        for name, key in GAUGES.items():
            self.gauges[name].set(getattr(stats, key))
