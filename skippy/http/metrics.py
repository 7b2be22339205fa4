"""Prometheus text-format metrics of the HTTP adapter (plus the broker's queue and readiness)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SPECULATIVE_COUNTS = ("windows", "proposed", "accepted", "full_accepts", "early_rejects", "tail_rejects",
                      "stops", "wasted_rows")


@dataclass
class Metrics:
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)  # (route, status)
    errors: Counter[str] = field(default_factory=Counter)  # by error code
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))
    ttft_sum: float = 0.0
    # counts summed over speculative requests
    speculative: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("requests", *SPECULATIVE_COUNTS), 0.0))

    def observe_stats(self, stats: tuple[tuple[str, float], ...]) -> None:
        """Add a finished request's speculative counts (windows, proposed, accepted, rejects, wasted rows)."""
        counts = dict(stats)
        if counts:
            self.speculative["requests"] += 1
        for name in SPECULATIVE_COUNTS:
            self.speculative[name] += counts.get(f"speculative_{name}", 0)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_counts[i] += 1
        self.ttft_counts[-1] += 1

    def render(self, broker: dict[str, float]) -> str:
        lines = ["# TYPE skippy_http_requests_total counter"]
        lines += [f'skippy_http_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())]
        lines.append("# TYPE skippy_request_errors_total counter")
        lines += [f'skippy_request_errors_total{{code="{c}"}} {n}' for c, n in sorted(self.errors.items())]
        lines += ["# TYPE skippy_prompt_tokens_total counter", f"skippy_prompt_tokens_total {self.prompt_tokens}",
                  "# TYPE skippy_completion_tokens_total counter", f"skippy_completion_tokens_total {self.completion_tokens}",
                  "# TYPE skippy_time_to_first_token_seconds histogram"]
        for bound, n in zip((*TTFT_BUCKETS, "+Inf"), self.ttft_counts):
            lines.append(f'skippy_time_to_first_token_seconds_bucket{{le="{bound}"}} {n}')
        lines += [f"skippy_time_to_first_token_seconds_sum {self.ttft_sum:.6f}",
                  f"skippy_time_to_first_token_seconds_count {self.ttft_counts[-1]}"]
        for name in ("requests", *SPECULATIVE_COUNTS):
            lines += [f"# TYPE skippy_speculative_{name}_total counter",
                      f"skippy_speculative_{name}_total {self.speculative[name]:g}"]
        for name, value in sorted(broker.items()):
            lines += [f"# TYPE skippy_{name} gauge", f"skippy_{name} {value:g}"]
        return "\n".join(lines) + "\n"
