"""llama-server's speculative counters on the HTTP adapter's /metrics, from the numbers stage 0 sends with
each finished request (as llama-server adds a slot's numbers when it is released).

llama-server (tools/server/server-task.cpp) exports `llamacpp:spec_decode_num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_drafts_total` (verification steps) and
`..._num_accepted_tokens_per_pos_total{position}`. skippy exports the same names with the prefix
`skippy_` in place of `llamacpp:` (every skippy metric starts with `skippy_`; a colon is Prometheus's
mark of a recording rule), so a dashboard charts either server by swapping the prefix:
`skippy_spec_decode_num_draft_tokens_total`, `skippy_spec_decode_num_accepted_tokens_total`,
`skippy_spec_decode_num_drafts_total` (verify windows) and
`skippy_spec_decode_num_accepted_tokens_per_pos_total{position="i"}` (windows whose draft i, from 0,
was accepted: position 0 over drafts is the first draft's acceptance rate).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from skippy.protocol.stats import SpeculativeStats

__all__ = ["SpecDecodeMetrics"]

PREFIX = "skippy_spec_decode_"


class SpecDecodeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.draft_tokens = Counter(f"{PREFIX}num_draft_tokens", "Speculative: Total draft tokens generated",
                                    registry=registry)
        self.accepted_tokens = Counter(f"{PREFIX}num_accepted_tokens",
                                       "Speculative: Total draft tokens accepted by the target model", registry=registry)
        self.drafts = Counter(f"{PREFIX}num_drafts", "Speculative: Total speculative decoding verification steps",
                              registry=registry)
        self.accepted_per_pos = Counter(f"{PREFIX}num_accepted_tokens_per_pos", "Accepted tokens per draft position",
                                        ["position"], registry=registry)

    def observe(self, stats: SpeculativeStats) -> None:
        """A finished request's verify windows."""
        for counter, value in ((self.draft_tokens, stats.proposed), (self.accepted_tokens, stats.accepted),
                               (self.drafts, stats.windows)):
            if value > 0:
                counter.inc(value)
        for position, count in enumerate(stats.accepted_per_pos):
            if count > 0:
                self.accepted_per_pos.labels(str(position)).inc(count)
