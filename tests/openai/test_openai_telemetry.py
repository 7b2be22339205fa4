"""Telemetry end to end over `skippy up`: spans from every process of one request reach a real OTLP gRPC
collector started here; every process serves its own /metrics, listed in the run directory; the
telemetry level reaches every child; a stalled collector costs requests nothing and drops are counted.
The traced pipeline asks for `--activation-wire-dtype auto`: stage 0's startup verdict (q8 certified on
the tiny llama) reaches the adapter through the broker's Status, its /metrics and the dashboard."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan
from up_helpers import SkippyServer

from skippy.telemetry.scrape import Sample, scrape
from skippy.telemetry.targets import TARGETS_FILE, read_targets

PROCESSES = {"stage0", "stage1", "broker", "adapter"}
WAIT_S = 30.0


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(start_up: Callable[..., Any], tiny_llama: Path, receiver: OtlpReceiver) -> Iterator[SkippyServer]:
    with start_up("up-telemetry", tiny_llama, "--metrics-otlp-grpc", receiver.url, "--telemetry-level", "debug",
                  "--activation-wire-dtype", "auto") as s:
        yield s


def complete(server: SkippyServer, max_tokens: int = 4) -> str:
    """One completion; returns its generation id (the request id every process uses)."""
    done = server.client().completions.create(model=server.model_id, prompt="hello there", max_tokens=max_tokens,
                                              extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == max_tokens
    return done.id.split("-", 1)[1]


def by_process(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        out.setdefault(str(span.resource.get("stage_id")), []).append(span)
    return out


def test_one_request_sends_spans_from_every_process(traced: SkippyServer, receiver: OtlpReceiver) -> None:
    rid = complete(traced)

    def of_request(name: str) -> list[ReceivedSpan]:
        return [s for s in receiver.snapshot() if s.name == name and s.attributes.get("request_id") == rid]

    summary_names = ("stage.openai_request_summary", "stage.openai_admission", "stage.openai_generation_summary",
                     "stage.openai_prefill")
    assert receiver.wait_for(lambda r: all(of_request(name) for name in summary_names), WAIT_S), \
        sorted({s.name for s in receiver.snapshot()})
    adapter, broker, driver, prefill = (of_request(name)[0] for name in summary_names)
    assert (adapter.resource["stage_id"], broker.resource["stage_id"], driver.resource["stage_id"]) == (
        "adapter", "broker", "stage0")
    assert adapter.trace_id == broker.trace_id == driver.trace_id == prefill.trace_id  # one trace for the request
    assert driver.attributes["generated_tokens"] == 4 and adapter.attributes["completion_tokens"] == 4
    session = driver.attributes["session_id"]
    assert receiver.wait_for(lambda r: any(s.name == "stage.binary_session_stop" and s.attributes["session_id"] == session
                                           for s in r.snapshot()), WAIT_S)
    spans = by_process(receiver.snapshot())
    assert PROCESSES <= set(spans)
    stop = next(s for s in spans["stage1"] if s.name == "stage.binary_session_stop" and s.attributes["session_id"] == session)
    assert stop.attributes["rows"] >= 4  # the prompt and the fed-back tokens ran through stage 1
    config = json.loads((traced.run_dir / "topology" / "stage1.json").read_text())
    reference = ("run_id", "model_id", "topology_id", "stage_id", "stage_index", "layer_start", "layer_end", "load_mode")
    assert {k: stop.resource[k] for k in reference} == {k: config[k] for k in reference}
    assert broker.resource["run_id"] == adapter.resource["run_id"] == config["run_id"]
    # debug level: per-message spans from both stages
    names = {process: {s.name for s in got} for process, got in spans.items()}
    assert {"stage.binary_message_timing", "stage.binary_llama_decode"} <= names["stage1"]
    assert {"stage.scheduler_iteration", "stage.openai_decode_token", "stage.binary_llama_decode"} <= names["stage0"]


def metrics_of(server: SkippyServer) -> dict[str, list[Sample]]:
    targets = read_targets(server.run_dir / TARGETS_FILE)
    got = {name: scrape(url, timeout_s=10.0) for name, url in targets}
    assert all(samples is not None for samples in got.values()), got.keys()
    return {name: samples or [] for name, samples in got.items()}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_every_process_serves_its_metrics_and_runs_at_the_given_level(traced: SkippyServer,
                                                                     receiver: OtlpReceiver) -> None:
    complete(traced)
    got = metrics_of(traced)
    assert set(got) == PROCESSES
    for name, samples in got.items():  # --telemetry-level and --metrics-otlp-grpc reached every child
        info = next(s for s in samples if s.name == "skippy_telemetry_info")
        assert (info.labels["level"], info.labels["otlp_endpoint"]) == ("debug", receiver.url), name
        assert value(samples, "skippy_telemetry_queue_capacity") == 1024
    stage1, stage0, broker, adapter = got["stage1"], got["stage0"], got["broker"], got["adapter"]
    assert value(stage1, "skippy_stage_batch_rows_count", stage_id="stage1") >= 4
    assert value(stage1, "skippy_stage_activation_bytes_total", stage_id="stage1", direction="in") > 0
    assert value(stage1, "skippy_stage_compute_seconds_sum", stage_id="stage1") > 0
    assert value(stage0, "skippy_driver_decode_tokens_total") >= 4
    assert value(stage0, "skippy_driver_prefill_tokens_total") > 0
    assert value(stage0, "skippy_stage_activation_bytes_total", stage_id="stage0", direction="out") > 0
    assert value(stage0, "skippy_pipeline_stage_compute_seconds_total", stage_id="stage1") > 0  # the driver's view
    assert 0 < value(stage0, "skippy_pipeline_stage_prefill_compute_seconds_total", stage_id="stage1") \
        <= value(stage0, "skippy_pipeline_stage_compute_seconds_total", stage_id="stage1")
    assert value(stage0, "skippy_driver_micro_batches_limit") == 1
    assert value(broker, "skippy_broker_admitted_total") >= 1 and value(broker, "skippy_broker_concurrency") == 2
    assert value(broker, "skippy_broker_requests_total", outcome="length") >= 1
    assert value(adapter, "skippy_time_per_output_token_seconds_count") >= 1
    assert value(adapter, "skippy_http_requests_total", route="/v1/completions", status="200") >= 1
    assert value(adapter, "skippy_activation_wire", asked="auto", used="q8", certified="true") == 1
    assert value(adapter, "skippy_activation_wire_agreement", dtype="q8") >= 0.9


def test_dashboard_is_served_with_the_whole_pipeline(traced: SkippyServer) -> None:
    page = traced.request("GET", "/dashboard")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert b'<script src="/dashboard/dashboard.js">' in page.body and b"http" not in page.body.split(b"<body>")[1]
    script = traced.request("GET", "/dashboard/dashboard.js")
    assert script.status == 200 and b"/dashboard/data" in script.body
    complete(traced)
    data = traced.request("GET", "/dashboard/data").json()
    assert {p["process"] for p in data["processes"] if p["up"]} == PROCESSES
    assert set(data["stages"]) == {"stage0", "stage1"} and all(s["scraped"] for s in data["stages"].values())
    assert data["adapter"]["completion_tokens"] >= 4 and data["driver"]["decode_tokens"] >= 4
    for stage in data["stages"].values():  # each stage's compute on batches carrying prompt tokens: its prefill rate
        assert stage["prefill_tokens"] == data["driver"]["prefill_tokens"] > 0
        assert 0 < stage["prefill_compute_seconds"]
    assert data["wire"]["used"] == "q8" and data["wire"]["asked"] == "auto" and data["wire"]["agreement"]["q8"] >= 0.9


def test_a_stalled_collector_costs_nothing_and_drops_are_counted(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    stalled = OtlpReceiver(stalled=True)  # accepts every export and never answers
    try:
        with start_up("up-stalled", tiny_llama, "--metrics-otlp-grpc", stalled.url, "--telemetry-level", "debug",
                      "--telemetry-queue-capacity", "4") as server:
            for _ in range(3):
                complete(server, max_tokens=16)  # requests finish although no span can leave
            assert stalled.wait_for(lambda r: r.exports >= 1, WAIT_S)  # the collector was reached, and stalls
            got = metrics_of(server)
            for name in ("stage0", "stage1"):
                assert value(got[name], "skippy_telemetry_events_dropped_total") > 0, name
                assert value(got[name], "skippy_telemetry_events_sent_total") == 0, name
                assert value(got[name], "skippy_telemetry_queue_depth") <= 4, name
            data = server.request("GET", "/dashboard/data").json()
            assert data["telemetry"]["dropped"] > 0
    finally:
        stalled.close()
