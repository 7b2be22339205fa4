"""WireCondition: validation and delay arithmetic."""

from __future__ import annotations

import math

import pytest

from skippy.config import ConfigError, WireCondition


def test_defaults_are_ideal() -> None:
    wire = WireCondition()
    assert wire.delay_ms == 0.0 and wire.mbps is None
    assert wire.is_ideal
    assert wire.propagation_s == 0.0
    assert wire.serialization_s(10**9) == 0.0


def test_delay_and_bandwidth() -> None:
    wire = WireCondition(delay_ms=25.0, mbps=8.0)
    assert not wire.is_ideal
    assert wire.propagation_s == pytest.approx(0.025)
    # 8 Mbps = 1,000,000 bytes/s.
    assert wire.serialization_s(500_000) == pytest.approx(0.5)
    assert wire.serialization_s(0) == 0.0


def test_serialization_is_capped_at_one_hour() -> None:
    wire = WireCondition(mbps=1e-9)
    assert wire.serialization_s(10**12) == 3600.0


def test_integer_delay_is_accepted_as_float() -> None:
    wire = WireCondition.from_dict({"delay_ms": 5})
    assert wire.delay_ms == 5.0 and isinstance(wire.delay_ms, float)


@pytest.mark.parametrize("delay", [-1.0, math.inf, -math.inf, math.nan, 3_600_000.5])
def test_bad_delay_rejected(delay: float) -> None:
    with pytest.raises(ConfigError, match="field 'delay_ms' must be finite and in"):
        WireCondition(delay_ms=delay)


def test_maximum_delay_accepted() -> None:
    assert WireCondition(delay_ms=3_600_000).propagation_s == 3600.0


@pytest.mark.parametrize("mbps", [0.0, -5.0, math.inf, math.nan])
def test_bad_mbps_rejected(mbps: float) -> None:
    with pytest.raises(ConfigError, match="field 'mbps' must be finite and > 0"):
        WireCondition(mbps=mbps)


def test_wrong_type_and_unknown_key_name_the_source() -> None:
    with pytest.raises(ConfigError, match=r"w.json: field 'delay_ms' must be a number, got \"5\""):
        WireCondition.from_dict({"delay_ms": "5"}, "w.json")
    with pytest.raises(ConfigError, match=r"w.json: field 'jitter_ms' is not a known"):
        WireCondition.from_dict({"jitter_ms": 1.0}, "w.json")


def test_round_trip() -> None:
    wire = WireCondition(delay_ms=12.5, mbps=100.0)
    assert WireCondition.from_dict(wire.to_dict()) == wire
