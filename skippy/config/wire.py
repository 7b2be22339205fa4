"""WireCondition: the link between a stage and its downstream — emulated delay and activation encoding.

A simulator for WAN experiments: every downstream write
is delayed by a fixed propagation delay plus the time to serialise the message
at ``mbps`` megabits per second (1 Mbps = 125 kB/s).  Both delays are capped
at one hour.  Jitter and stalls are not modelled here
(real delay, jitter and rate limits between network namespaces: `skippy.netns`).
``activation_dtype`` is how batches' activations are packed on this link
(``--activation-wire-dtype``: f32, f16 or q8; see `skippy.protocol.activations`). The flag may also say
``auto`` (`WireChoice`): the links start in f32 and stage 0 picks the smallest format that passes its
startup certification (skippy.driver.wire_certify).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from skippy.config.schema import ConfigModel, check
from skippy.protocol.kinds import WireDtype

__all__ = ["MAX_WIRE_DELAY_MS", "MAX_WIRE_DELAY_S", "WireChoice", "WireCondition"]

MAX_WIRE_DELAY_S = 3600.0
MAX_WIRE_DELAY_MS = MAX_WIRE_DELAY_S * 1000.0
_BYTES_PER_SECOND_PER_MBPS = 125_000.0


class WireChoice(enum.StrEnum):
    """What ``--activation-wire-dtype`` asks for: one format, or ``auto`` (the smallest that certifies)."""

    F32 = "f32"
    F16 = "f16"
    Q8 = "q8"
    AUTO = "auto"

    @property
    def initial(self) -> WireDtype:
        """The format the links start with: the asked one; f32 under auto (until stage 0 certifies)."""
        return WireDtype.F32 if self is WireChoice.AUTO else WireDtype(self.value)


@dataclass(frozen=True)
class WireCondition(ConfigModel):
    """Propagation delay (ms), optional bandwidth (Mbps) and activation encoding of one link."""

    delay_ms: float = 0.0
    mbps: float | None = None
    activation_dtype: WireDtype = WireDtype.F32

    def _check(self) -> None:
        check(
            math.isfinite(self.delay_ms) and 0.0 <= self.delay_ms <= MAX_WIRE_DELAY_MS,
            "delay_ms",
            f"must be finite and in [0, {MAX_WIRE_DELAY_MS:.0f}], got {self.delay_ms}",
        )
        if self.mbps is not None:
            check(
                math.isfinite(self.mbps) and self.mbps > 0.0,
                "mbps",
                f"must be finite and > 0, got {self.mbps}",
            )

    @property
    def is_ideal(self) -> bool:
        """True when the link adds no delay at all."""
        return self.delay_ms == 0.0 and self.mbps is None

    @property
    def propagation_s(self) -> float:
        """Per-message propagation delay in seconds."""
        return self.delay_ms / 1000.0

    def serialization_s(self, nbytes: int) -> float:
        """Seconds to put ``nbytes`` on the wire at ``mbps`` (0 when unlimited)."""
        if self.mbps is None or nbytes <= 0:
            return 0.0
        seconds = nbytes / (self.mbps * _BYTES_PER_SECOND_PER_MBPS)
        return min(seconds, MAX_WIRE_DELAY_S)  # an infinite quotient is capped, not zeroed
