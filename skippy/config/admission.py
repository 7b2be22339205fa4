"""Generation admission options: the one home of the ``--openai-generation-*`` flag group.

:class:`AdmissionOptions` is resolved once from flags by :func:`resolve_admission` and the broker
is built from it.  Where a broker is started as a child process, ``AdmissionOptions.to_flags``
writes the flags back and the broker's CLI parses them with the same resolver, so
``resolve_admission(to_flags())`` gives the same object.

Two callers, one resolver.  Stage 0 with an OpenAI front (and ``skippy up``) knows its
``lane_count``, so it applies the rules bound to it: concurrency
defaults to ``lane_count`` and may not exceed it, the queue capacity defaults to
``clamp(8 * concurrency, 16, 256)`` and must be > 0.  ``skippy broker`` serves replicas whose lane
counts it learns from their Status, so it leaves unset values unset (resolved per pipeline by
``per_pipeline`` and ``capacity_for``) and takes a queue capacity of 0 (no waiting).  Value rules
between fields ("min concurrency requires adaptive", "min <= concurrency") are the object's own,
so they hold however it is built; their errors name the flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skippy.config.errors import ConfigError, FieldError
from skippy.config.schema import ConfigModel, check
from skippy.config.serving_args import FlagReader

__all__ = ["ADMISSION_FLAGS", "AdmissionOptions", "default_queue_capacity", "resolve_admission"]

# field -> the flag that sets it (stage 0's `--openai-*` surface, which `skippy broker` shares)
ADMISSION_FLAGS = {
    "generation_concurrency": "--openai-generation-concurrency",
    "adaptive": "--openai-adaptive-generation-concurrency",
    "adaptive_min_concurrency": "--openai-adaptive-generation-min-concurrency",
    "queue_capacity": "--openai-generation-queue-capacity",
    "admission_timeout_secs": "--openai-generation-admission-timeout-secs",
}


def default_queue_capacity(concurrency: int) -> int:
    """The default wait-queue capacity: ``clamp(8 * concurrency, 16, 256)``."""
    return min(max(8 * concurrency, 16), 256)


@dataclass(frozen=True, kw_only=True)
class AdmissionOptions(ConfigModel):
    """Generation admission: execution permits, wait queue and its timeout, adaptive control."""

    generation_concurrency: int | None = None  # permits per ready pipeline; None = its lane_count
    adaptive: bool = False
    adaptive_min_concurrency: int | None = None  # adaptive only: where control starts (None = 1)
    queue_capacity: int | None = None  # waiting requests; None = clamp(8 x total concurrency, 16, 256)
    admission_timeout_secs: float = 0.0  # 0 = wait until the client cancels

    def _check(self) -> None:
        concurrency, minimum = self.generation_concurrency, self.adaptive_min_concurrency
        check(concurrency is None or concurrency > 0, "generation_concurrency", f"must be > 0, got {concurrency}")
        check(minimum is None or minimum > 0, "adaptive_min_concurrency", f"must be > 0, got {minimum}")
        check(self.adaptive or minimum is None, "adaptive_min_concurrency", f"requires {ADMISSION_FLAGS['adaptive']}")
        check(concurrency is None or minimum is None or minimum <= concurrency, "adaptive_min_concurrency",
              f"must be <= {ADMISSION_FLAGS['generation_concurrency']} ({concurrency}), got {minimum}")
        timeout = self.admission_timeout_secs
        check(math.isfinite(timeout) and timeout >= 0, "admission_timeout_secs",
              f"must be finite and >= 0, got {timeout:g}")

    @property
    def start_concurrency(self) -> int:
        """Where adaptive control starts."""
        return self.adaptive_min_concurrency or 1

    def per_pipeline(self, lane_count: int) -> int:
        """Permits for one ready pipeline with ``lane_count`` lanes."""
        concurrency = self.generation_concurrency
        return lane_count if concurrency is None else min(concurrency, lane_count)

    def capacity_for(self, total_concurrency: int) -> int:
        """The wait queue's capacity while ``total_concurrency`` permits exist."""
        if self.queue_capacity is not None:
            return self.queue_capacity
        return default_queue_capacity(total_concurrency)

    def to_flags(self) -> list[str]:
        """These options as command-line flags; :func:`resolve_admission` reads them back unchanged."""
        flags: list[str] = []
        for name, flag in ADMISSION_FLAGS.items():
            value = getattr(self, name)
            if value is True:
                flags.append(flag)
            elif value is not None and value is not False:
                flags += [flag, str(value)]
        return flags


def resolve_admission(flags: FlagReader, lane_count: int | None = None) -> AdmissionOptions:
    """The admission flags in ``flags``, validated; see the module docstring for ``lane_count``."""
    names = ADMISSION_FLAGS
    concurrency = flags.optional_integer(names["generation_concurrency"])
    capacity = flags.optional_integer(names["queue_capacity"], minimum=0 if lane_count is None else 1)
    if lane_count is not None:  # stage 0: the defaults and the bound from its lane_count
        concurrency = lane_count if concurrency is None else concurrency
        if concurrency > lane_count:
            raise ConfigError(f"{names['generation_concurrency']} must be <= lane_count ({lane_count}),"
                              f" got {concurrency}")
        capacity = default_queue_capacity(concurrency) if capacity is None else capacity
    adaptive = flags.switch(names["adaptive"])
    minimum = flags.optional_integer(names["adaptive_min_concurrency"])
    try:
        return AdmissionOptions(
            generation_concurrency=concurrency,
            adaptive=adaptive,
            adaptive_min_concurrency=1 if adaptive and minimum is None else minimum,
            queue_capacity=capacity,
            admission_timeout_secs=flags.number(names["admission_timeout_secs"], 0.0),
        )
    except FieldError as error:
        raise error.as_flag(names[error.field]) from None
