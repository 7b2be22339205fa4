"""The window policy's live state on stage 0's /metrics: how many running sessions use each window size k
(k = 0: the policy found no gain, the session decodes plainly and its drafts are kept as shadows) and
their mean acceptance estimate alpha, and the draft tokens sent and accepted by source (native MTP, its
n-gram extension, or the session's proposer). Read when scraped, from the scrape thread (a snapshot of the
sessions)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from skippy.driver.speculative.engine import Speculation

__all__ = ["SpeculationCollector"]


class SpeculationCollector(Collector):
    def __init__(self, speculation: Speculation) -> None:
        self.speculation = speculation

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        sessions = list(self.speculation.sessions.values())
        by_k = GaugeMetricFamily("skippy_speculative_sessions_by_k", "running sessions by the window policy's"
                                 " current k (0: decoding plainly, drafts kept as shadows)", labels=["k"])
        counts = Counter(session.k for session in sessions)
        for k in range(self.speculation.max_k + 1):
            by_k.add_metric([str(k)], counts.get(k, 0))
        yield by_k
        alpha = sum(session.stats.alpha for session in sessions) / len(sessions) if sessions else 0.0
        yield GaugeMetricFamily("skippy_speculative_alpha_mean", "mean acceptance estimate of the running"
                                " sessions (0 when none)", value=alpha)
        proposed = CounterMetricFamily("skippy_speculative_draft_tokens_by_source", "draft tokens sent in verify"
                                       " windows, by source (native_mtp, ngram_extension, or the proposer)",
                                       labels=["source"])
        accepted = CounterMetricFamily("skippy_speculative_accepted_tokens_by_source", "draft tokens accepted,"
                                       " by source", labels=["source"])
        for source, (n_proposed, n_accepted) in sorted(self.speculation.totals.by_source.items()):
            proposed.add_metric([source], n_proposed)
            accepted.add_metric([source], n_accepted)
        yield proposed
        yield accepted
