"""The window policy's live state on stage 0's /metrics: how many running sessions use each window size k
(k = 0: the policy found no gain, the session decodes plainly and its drafts are kept as shadows), each
running session's k and alpha (`session` = its session id; gone when it finishes), their mean alpha, and
the draft tokens proposed / accepted by where they came from (`source`: "own" = the session's own history,
"global" = the cross-request index, "native_mtp" = the final stage's MTP head, "ngram_extension" = the n-gram
tail after it, else the proposer's name). Read when scraped, from the scrape thread (a snapshot of the
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
        running = list(self.speculation.sessions.items())
        sessions = [session for _sid, session in running]
        by_k = GaugeMetricFamily("skippy_speculative_sessions_by_k", "running sessions by the window policy's"
                                 " current k (0: decoding plainly, drafts kept as shadows)", labels=["k"])
        counts = Counter(session.k for session in sessions)
        for k in range(self.speculation.max_k + 1):
            by_k.add_metric([str(k)], counts.get(k, 0))
        yield by_k
        alpha = sum(session.stats.alpha for session in sessions) / len(sessions) if sessions else 0.0
        yield GaugeMetricFamily("skippy_speculative_alpha_mean", "mean acceptance estimate of the running"
                                " sessions (0 when none)", value=alpha)
        session_k = GaugeMetricFamily("skippy_speculative_session_k", "the policy's current k of each running session",
                              labels=["session"])
        session_alpha = GaugeMetricFamily("skippy_speculative_session_alpha", "acceptance estimate of each running"
                                          " session", labels=["session"])
        for session_id, session in running:
            session_k.add_metric([str(session_id)], session.k)
            session_alpha.add_metric([str(session_id)], session.stats.alpha)
        yield session_k
        yield session_alpha
        totals = self.speculation.totals
        for name, by_source in (("proposed", totals.proposed_by_source), ("accepted", totals.accepted_by_source)):
            family = CounterMetricFamily(f"skippy_speculative_source_{name}_tokens", f"draft tokens {name} in verify"
                                         " windows, by where the proposal came from", labels=["source"])
            for source, count in sorted(by_source.copy().items()):
                family.add_metric([source], count)
            yield family
