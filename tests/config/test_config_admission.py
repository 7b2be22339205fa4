"""Admission options, the one home of the ``--openai-generation-*`` flags: resolved for stage 0's
front (reference defaults from lane_count), for ``skippy broker`` (unset values left to each
pipeline), written back by ``to_flags`` and read again unchanged; the value rules hold however the
object is built, and every error names its flag."""

from __future__ import annotations

import argparse

import pytest
from config_helpers import OPENAI, Serve, ServeError

from skippy.config import (
    AdmissionOptions,
    ConfigError,
    FieldError,
    FlagReader,
    Owner,
    add_serving_arguments,
    default_queue_capacity,
    resolve_admission,
)


def broker_admission(*flags: str) -> AdmissionOptions:
    """Resolve ``flags`` as `skippy broker` does: the admission flags only, no lane_count."""
    parser = argparse.ArgumentParser()
    add_serving_arguments(parser, [Owner.BROKER])
    return resolve_admission(FlagReader(parser.parse_args(list(flags))))


def front_admission(serve: Serve, *flags: str, lane_count: int = 4) -> AdmissionOptions:
    openai = serve(*OPENAI, *flags, stage={"lane_count": lane_count}).openai
    assert openai is not None
    return openai.admission


# -- stage 0's front: the reference's defaults, from lane_count ---------------------------------


def test_front_defaults(serve: Serve) -> None:
    assert front_admission(serve) == AdmissionOptions(generation_concurrency=4, queue_capacity=32)
    admission = front_admission(serve)
    assert admission.adaptive is False and admission.adaptive_min_concurrency is None
    assert admission.admission_timeout_secs == 0.0


@pytest.mark.parametrize(("concurrency", "capacity"), [(1, 16), (2, 16), (4, 32), (32, 256), (64, 256)])
def test_default_queue_capacity(concurrency: int, capacity: int) -> None:
    assert default_queue_capacity(concurrency) == capacity


def test_concurrency_override_derives_queue_capacity(serve: Serve) -> None:
    admission = front_admission(serve, "--openai-generation-concurrency", "1")
    assert (admission.generation_concurrency, admission.queue_capacity) == (1, 16)
    assert admission.admission_timeout_secs == 0.0
    big = front_admission(serve, "--openai-generation-concurrency", "32", lane_count=32)
    assert big.queue_capacity == 256


def test_queue_capacity_override_keeps_concurrency(serve: Serve) -> None:
    admission = front_admission(serve, "--openai-generation-queue-capacity", "3")
    assert (admission.generation_concurrency, admission.queue_capacity) == (4, 3)
    assert admission.admission_timeout_secs == 0.0


def test_timeout_override_changes_nothing_else(serve: Serve) -> None:
    admission = front_admission(serve, "--openai-generation-admission-timeout-secs", "7.5")
    assert admission.admission_timeout_secs == 7.5
    assert (admission.generation_concurrency, admission.queue_capacity) == (4, 32)


def test_adaptive_concurrency(serve: Serve) -> None:
    admission = front_admission(serve, "--openai-adaptive-generation-concurrency")
    assert admission.adaptive and admission.adaptive_min_concurrency == 1
    admission = front_admission(
        serve, "--openai-adaptive-generation-concurrency", "--openai-adaptive-generation-min-concurrency", "3"
    )
    assert admission.adaptive_min_concurrency == 3


MIN_WITHOUT_ADAPTIVE = (
    "--openai-adaptive-generation-min-concurrency requires --openai-adaptive-generation-concurrency"
)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--openai-generation-concurrency 0", "--openai-generation-concurrency must be > 0, got 0"),
        ("--openai-generation-concurrency 5", "--openai-generation-concurrency must be <= lane_count (4), got 5"),
        ("--openai-generation-queue-capacity 0", "--openai-generation-queue-capacity must be > 0, got 0"),
        (
            "--openai-generation-admission-timeout-secs -1",
            "--openai-generation-admission-timeout-secs must be finite and >= 0",
        ),
        ("--openai-adaptive-generation-min-concurrency 2", MIN_WITHOUT_ADAPTIVE),
        (
            "--openai-adaptive-generation-concurrency --openai-adaptive-generation-min-concurrency 5",
            "--openai-adaptive-generation-min-concurrency must be <= --openai-generation-concurrency (4), got 5",
        ),
    ],
)
def test_bad_front_admission_flags(serve_error: ServeError, flags: str, expected: str) -> None:
    assert serve_error(*OPENAI, *flags.split()).startswith(expected)


# -- skippy broker: unset values follow each pipeline ------------------------------------------


def test_broker_leaves_unset_values_to_the_pipelines() -> None:
    admission = broker_admission()
    assert admission == AdmissionOptions()
    assert (admission.per_pipeline(3), admission.per_pipeline(8)) == (3, 8)
    assert (admission.capacity_for(0), admission.capacity_for(4), admission.capacity_for(64)) == (16, 32, 256)
    assert admission.start_concurrency == 1


def test_broker_values_bound_each_pipeline() -> None:
    admission = broker_admission("--openai-generation-concurrency", "2", "--openai-generation-queue-capacity", "0")
    assert (admission.per_pipeline(1), admission.per_pipeline(8)) == (1, 2)
    assert admission.capacity_for(16) == 0  # 0 = no waiting (the broker takes it; stage 0 does not)


def test_broker_and_front_share_the_min_concurrency_rule(serve_error: ServeError) -> None:
    flags = ("--openai-adaptive-generation-min-concurrency", "2")
    with pytest.raises(ConfigError) as info:
        broker_admission(*flags)
    assert str(info.value) == MIN_WITHOUT_ADAPTIVE == serve_error(*OPENAI, *flags)


# -- to_flags: the one way back to flags --------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--openai-generation-concurrency", "2", "--openai-generation-admission-timeout-secs", "1.5"),
        ("--openai-adaptive-generation-concurrency", "--openai-adaptive-generation-min-concurrency", "3"),
        ("--openai-generation-queue-capacity", "0"),
    ],
)
def test_broker_flags_round_trip(flags: tuple[str, ...]) -> None:
    admission = broker_admission(*flags)
    assert broker_admission(*admission.to_flags()) == admission


@pytest.mark.parametrize(
    "flags", [(), ("--openai-generation-concurrency", "1"), ("--openai-adaptive-generation-concurrency",)]
)
def test_front_options_reach_the_broker_unchanged(serve: Serve, flags: tuple[str, ...]) -> None:
    """What stage 0 (or skippy up) resolved is exactly what its broker child resolves."""
    admission = front_admission(serve, *flags)
    assert admission.generation_concurrency is not None and admission.queue_capacity is not None
    assert broker_admission(*admission.to_flags()) == admission


def test_to_flags_writes_switches_and_values() -> None:
    admission = AdmissionOptions(generation_concurrency=2, adaptive=True, queue_capacity=5)
    assert admission.to_flags() == [
        "--openai-generation-concurrency", "2",
        "--openai-adaptive-generation-concurrency",
        "--openai-generation-queue-capacity", "5",
        "--openai-generation-admission-timeout-secs", "0.0",
    ]  # fmt: skip


# -- the object's own rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"adaptive_min_concurrency": 2}, "adaptive_min_concurrency", "requires --openai-adaptive-generation-concurrency"),
        (
            {"adaptive": True, "adaptive_min_concurrency": 3, "generation_concurrency": 2},
            "adaptive_min_concurrency",
            "must be <= --openai-generation-concurrency (2), got 3",
        ),
        ({"generation_concurrency": 0}, "generation_concurrency", "must be > 0, got 0"),
        ({"admission_timeout_secs": float("inf")}, "admission_timeout_secs", "must be finite and >= 0, got inf"),
    ],
)
def test_direct_construction_is_checked(fields: dict[str, object], field: str, reason: str) -> None:
    with pytest.raises(FieldError) as info:
        AdmissionOptions(**fields)  # type: ignore[arg-type]
    assert (info.value.field, info.value.reason) == (field, reason)
