"""Prefill chunk sizes at stage 0: fixed, schedule, or an adaptive ramp driven by what the link shows.

adaptive-ramp: start at `start`; after each chunk, with c = stage-0 compute ms of that chunk,
grow by `step` when the transfer hid behind compute (downstream wait <= 0.75c and write <= 0.25c),
shrink by `step` when it was exposed (wait > 1.25c or write > 0.75c); clamp to [start, max] and to
a ceiling of target_ms / (slowest stage's measured ms per token).

A ramp pays by overlapping a prompt's chunks on different stages. Where no two stages compute at once (every
stage on the same cores, or a single stage: one micro-batch in flight) chunks cannot overlap, and each one
only adds a batch's fixed cost (the weights read once more): `unpipelined` starts the ramp at its maximum
there, unless a chunk-size flag (--openai-prefill-adaptive-*, -chunk-size, -chunk-schedule) or another
policy chose them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from skippy.config import PrefillChunkOptions, PrefillChunkPolicy


def unpipelined(options: PrefillChunkOptions) -> PrefillChunkOptions:
    """Chunks for a pipeline whose stages never compute at once: the ramp's largest from the first chunk (a prompt
    up to adaptive_max rows in one batch), unless the user gave a prefill flag."""
    if options.policy is not PrefillChunkPolicy.ADAPTIVE_RAMP or options.given:
        return options
    return replace(options, adaptive_start=options.adaptive_max)


@dataclass
class ChunkObservation:
    compute_ms: float  # stage 0's compute for the chunk
    write_ms: float  # time to put it on the wire
    wait_ms: float  # time waiting for a downstream credit
    slowest_ms_per_token: float | None = None  # from the stages' reported compute timings


class ChunkPlanner:
    """Chunk sizes for one request's prefill."""

    def __init__(self, options: PrefillChunkOptions) -> None:
        self.options = options
        self.index = 0
        self.next_size = options.adaptive_start
        self.ceiling = options.adaptive_max

    def size(self) -> int:
        o = self.options
        if o.policy == PrefillChunkPolicy.FIXED:
            return o.chunk_size
        if o.policy == PrefillChunkPolicy.SCHEDULE:
            return o.schedule[min(self.index, len(o.schedule) - 1)]
        return max(o.adaptive_start, min(self.next_size, self.ceiling))

    def observe(self, obs: ChunkObservation) -> None:
        self.index += 1
        o = self.options
        if o.policy != PrefillChunkPolicy.ADAPTIVE_RAMP:
            return
        if obs.slowest_ms_per_token and obs.slowest_ms_per_token > 0:
            predicted = int(o.adaptive_target_ms / obs.slowest_ms_per_token)
            stepped = o.adaptive_start + max(0, (predicted - o.adaptive_start) // o.adaptive_step) * o.adaptive_step
            self.ceiling = min(max(stepped, o.adaptive_start), o.adaptive_max)
        c = max(obs.compute_ms, 0.001)
        if obs.wait_ms <= 0.75 * c and obs.write_ms <= 0.25 * c:
            self.next_size = min(self.next_size + o.adaptive_step, o.adaptive_max)
        elif obs.wait_ms > 1.25 * c or obs.write_ms > 0.75 * c:
            self.next_size = max(self.next_size - o.adaptive_step, o.adaptive_start)
        self.next_size = min(self.next_size, self.ceiling)
