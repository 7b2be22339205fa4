"""The broker's admission settings: per-pipeline concurrency, queue capacity, timeout, adaptive control.

Unset values follow the reference defaults, resolved when pipelines report their Status:
concurrency = each pipeline's `lane_count` (a configured value is clamped to it), queue capacity
= `clamp(8 x total concurrency, 16, 256)`.  Invalid values raise a one-line `ConfigError` naming
the `skippy broker` flag that sets them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skippy.config import AdmissionOptions, ConfigError, default_queue_capacity

__all__ = ["BrokerAdmission", "FLAGS"]

FLAGS = {
    "concurrency": "--openai-generation-concurrency",
    "queue_capacity": "--openai-generation-queue-capacity",
    "timeout_s": "--openai-generation-admission-timeout-secs",
    "adaptive": "--openai-adaptive-generation-concurrency",
    "adaptive_min": "--openai-adaptive-generation-min-concurrency",
}


@dataclass(frozen=True, kw_only=True)
class BrokerAdmission:
    concurrency: int | None = None  # permits per ready pipeline; None = its lane_count
    queue_capacity: int | None = None  # waiting requests; None = clamp(8 x total concurrency, 16, 256)
    timeout_s: float = 0.0  # queue wait limit; 0 = until the client cancels
    adaptive: bool = False
    adaptive_min: int = 1  # adaptive control starts here

    def __post_init__(self) -> None:
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or self.concurrency < 1):
            raise ConfigError(f"{FLAGS['concurrency']} must be > 0, got {self.concurrency}")
        if self.queue_capacity is not None and self.queue_capacity < 0:
            raise ConfigError(f"{FLAGS['queue_capacity']} must be >= 0, got {self.queue_capacity}")
        if not math.isfinite(self.timeout_s) or self.timeout_s < 0:
            raise ConfigError(f"{FLAGS['timeout_s']} must be finite and >= 0, got {self.timeout_s}")
        if self.adaptive_min < 1:
            raise ConfigError(f"{FLAGS['adaptive_min']} must be > 0, got {self.adaptive_min}")
        if not self.adaptive and self.adaptive_min != 1:
            raise ConfigError(f"{FLAGS['adaptive_min']} requires {FLAGS['adaptive']}")
        if self.concurrency is not None and self.adaptive_min > self.concurrency:
            raise ConfigError(f"{FLAGS['adaptive_min']} must be <= {FLAGS['concurrency']} ({self.concurrency}),"
                              f" got {self.adaptive_min}")

    @classmethod
    def of(cls, options: BrokerAdmission | AdmissionOptions | None) -> BrokerAdmission:
        """Accept the stage server's resolved AdmissionOptions too (its values are all explicit)."""
        if options is None:
            return cls()
        if isinstance(options, BrokerAdmission):
            return options
        return cls(concurrency=options.generation_concurrency, queue_capacity=options.queue_capacity,
                   timeout_s=options.admission_timeout_secs, adaptive=options.adaptive,
                   adaptive_min=options.adaptive_min_concurrency or 1)

    def per_pipeline(self, lane_count: int) -> int:
        """Permits for one ready pipeline with `lane_count` lanes."""
        return lane_count if self.concurrency is None else min(self.concurrency, lane_count)

    def capacity_for(self, total_concurrency: int) -> int:
        if self.queue_capacity is not None:
            return self.queue_capacity
        return default_queue_capacity(total_concurrency)
