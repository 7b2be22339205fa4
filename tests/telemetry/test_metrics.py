"""Prometheus metrics and their readers: a process's /metrics (registries + telemetry counters; on
loopback by default, behind the API key when one is set), the run directory's targets file, and the
dashboard's summary of every process's samples."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from skippy.adapter.request_metrics import Metrics
from skippy.config import TelemetryLevel
from skippy.protocol.stats import RequestStats, SpeculativeStats
from skippy.telemetry.metrics import StageMetrics
from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import Telemetry, _endpoint_host
from skippy.telemetry.scrape import parse, scrape, summarise
from skippy.telemetry.targets import TARGETS_FILE, read_targets, record_target


def stage_metrics(registry: CollectorRegistry, stage_id: str, depth: list[int]) -> StageMetrics:
    return StageMetrics(registry, stage_id, queue_depth=lambda: depth[0], kv_cells=lambda: 40, sessions=lambda: 2,
                        credits_outstanding=lambda: 1)


def samples_of(text: bytes) -> dict[str, float]:
    return {s.name + str(sorted(s.labels.items())): s.value for s in parse(text.decode())}


def test_stage_metrics_count_batches_and_read_gauges_when_scraped() -> None:
    registry, depth = CollectorRegistry(), [3]
    metrics = stage_metrics(registry, "stage1", depth)
    metrics.observe(rows=8, compute_ms=20.0, credit_wait_ms=5.0, bytes_in=2048, bytes_out=0)
    metrics.observe(rows=1, compute_ms=2.0, credit_wait_ms=0.0, bytes_in=256, bytes_out=0)
    depth[0] = 7
    got = {s.name: s.value for s in parse(_render(registry)) if "le" not in s.labels and s.labels.get("direction") != "out"}
    assert got["skippy_stage_batch_rows_count"] == 2 and got["skippy_stage_batch_rows_sum"] == 9
    assert got["skippy_stage_compute_seconds_sum"] == pytest.approx(0.022)
    assert got["skippy_stage_credit_waits_total"] == 1 and got["skippy_stage_credit_wait_seconds_total"] == pytest.approx(0.005)
    assert got["skippy_stage_activation_bytes_total"] == 2304
    assert (got["skippy_stage_queue_depth"], got["skippy_stage_kv_cells"], got["skippy_stage_sessions"]) == (7, 40, 2)


def _render(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


def test_process_serves_attached_registries_and_its_telemetry_counters() -> None:
    telemetry = Telemetry(TelemetryOptions(TelemetryLevel.DEBUG, 64), "stage")
    registry = CollectorRegistry()
    stage_metrics(registry, "stage1", [0])
    telemetry.attach(registry)  # not installed: kept to itself
    assert b"skippy_stage_batch_rows" not in telemetry.render()
    telemetry.installed = True
    telemetry.attach(registry)
    url = telemetry.serve_metrics("127.0.0.1")
    try:
        served = {s.name: s for s in scrape(url) or []}
        assert "skippy_stage_batch_rows_count" in served
        assert served["skippy_telemetry_queue_capacity"].value == 64
        assert served["skippy_telemetry_events_dropped_total"].value == 0
        assert served["skippy_telemetry_info"].labels == {"role": "stage", "level": "debug", "otlp_endpoint": ""}
    finally:
        telemetry.close()
    assert scrape(url, timeout_s=2.0) is None  # stopped serving


def test_spans_need_an_endpoint_and_a_level() -> None:
    assert not Telemetry(TelemetryOptions(TelemetryLevel.DEBUG)).spans  # no collector: nothing queued
    quiet = Telemetry(TelemetryOptions(TelemetryLevel.OFF, otlp_endpoint="http://127.0.0.1:9"))
    assert quiet.queue is None
    summary = Telemetry(TelemetryOptions(TelemetryLevel.SUMMARY, otlp_endpoint="http://127.0.0.1:9"))
    try:
        assert summary.spans and not summary.debug_spans
        summary.span("x", 0.0, 1.0, debug=True)
        assert summary.queue is not None and summary.queue.queued == 0
    finally:
        summary.close()


def test_adapter_metrics_keep_their_names() -> None:
    metrics = Metrics(Telemetry())
    metrics.count_request("/v1/completions", 200)
    metrics.generation_started("r1", 0.0, prompt_tokens=5, kind="completion")
    metrics.tokens("r1", 1)
    metrics.tokens("r1", 2)  # a step that committed two
    metrics.generation_done("r1", None, stopped=True)
    metrics.observe_stats(RequestStats(speculative=SpeculativeStats(proposed=4, accepted=3)))
    got = samples_of(metrics.render())
    assert got["skippy_http_requests_total[('route', '/v1/completions'), ('status', '200')]"] == 1
    assert got["skippy_prompt_tokens_total[]"] == 5 and got["skippy_completion_tokens_total[]"] == 3
    assert got["skippy_time_to_first_token_seconds_count[]"] == 1
    assert got["skippy_time_per_output_token_seconds_count[]"] == 1
    assert got["skippy_speculative_requests_total[]"] == 1 and got["skippy_speculative_accepted_total[]"] == 3
    assert metrics.requests_total() == 1


def test_targets_file_lists_each_process_once(tmp_path: Path) -> None:
    record_target(tmp_path, "stage1", {"metrics_url": "http://127.0.0.1:4000/metrics"})
    record_target(tmp_path, "broker", {"endpoint": "ipc:///x"})  # no metrics URL: not listed
    record_target(tmp_path, "adapter", {"metrics_url": "http://127.0.0.1:9337/metrics"})
    record_target(tmp_path, "stage1", {"metrics_url": "http://127.0.0.1:4001/metrics"})  # restarted: replaced
    assert read_targets(tmp_path / TARGETS_FILE) == [("adapter", "http://127.0.0.1:9337/metrics"),
                                                    ("stage1", "http://127.0.0.1:4001/metrics")]
    assert read_targets(tmp_path / "missing.json") == []


def _status(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as reply:
            return reply.status, dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


def test_metrics_listen_on_loopback_by_default_and_want_the_key_when_set() -> None:
    telemetry = Telemetry(TelemetryOptions(TelemetryLevel.SUMMARY), "stage")
    url = telemetry.serve_metrics(api_key="sk-metrics")
    try:
        assert url.startswith("http://127.0.0.1:") and telemetry._server is not None
        assert telemetry._server.server_address[0] == "127.0.0.1"
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-metrics"}):
            status, got = _status(url, headers)
            assert status == 401 and got["WWW-Authenticate"] == "Bearer", headers
        assert scrape(url, timeout_s=10.0) is None and scrape(url, timeout_s=10.0, api_key="sk-wrong") is None
        samples = scrape(url, timeout_s=10.0, api_key="sk-metrics")
        assert samples is not None and any(s.name == "skippy_telemetry_queue_capacity" for s in samples)
        openmetrics = _status(url, {"Authorization": "Bearer sk-metrics", "Accept": "application/openmetrics-text"})
        assert openmetrics[0] == 200 and openmetrics[1]["Content-Type"].startswith("application/openmetrics-text")
        assert _status(url.replace("/metrics", "/other"), {"Authorization": "Bearer sk-metrics"})[0] == 404
    finally:
        telemetry.close()


@pytest.mark.parametrize(("endpoint", "host"), [(None, None), ("ipc:///run/s.sock", None), ("tcp://*:9000", None),
                                                ("tcp://10.0.0.5:9000", "10.0.0.5"), ("tcp://[fd00::5]:9000", "fd00::5")])
def test_a_wildcard_metrics_bind_is_announced_at_the_stage_endpoints_host(endpoint: str | None, host: str | None) -> None:
    assert _endpoint_host(endpoint) == host


def test_summary_merges_processes_and_falls_back_to_the_drivers_view() -> None:
    driver = CollectorRegistry()
    stage_metrics(driver, "stage0", [0]).observe(4, 10.0, 0.0, 0, 1024)
    text = _render(driver) + (
        '# TYPE skippy_pipeline_stage_compute_seconds counter\n'
        'skippy_pipeline_stage_compute_seconds_total{stage_id="stage0"} 0.01\n'
        'skippy_pipeline_stage_compute_seconds_total{stage_id="stage1"} 0.5\n'
        '# TYPE skippy_pipeline_stage_prefill_compute_seconds counter\n'
        'skippy_pipeline_stage_prefill_compute_seconds_total{stage_id="stage1"} 0.25\n'
        '# TYPE skippy_driver_prefill_tokens counter\nskippy_driver_prefill_tokens_total 100\n'
        '# TYPE skippy_driver_sessions_running gauge\nskippy_driver_sessions_running 2\n')
    adapter = ('# TYPE skippy_completion_tokens counter\nskippy_completion_tokens_total 12\n'
               '# TYPE skippy_http_requests counter\nskippy_http_requests_total{route="/v1/completions",status="200"} 3\n'
               'skippy_http_requests_total{route="/dashboard/data",status="200"} 40\n')
    summary = summarise([("adapter", "a", parse(adapter)), ("stage0", "s0", parse(text)), ("stage1", "s1", None)])
    assert summary["adapter"]["completion_tokens"] == 12
    assert summary["adapter"]["requests"] == 3  # the dashboard's own polls are not the API's requests
    assert summary["driver"]["running"] == 2 and summary["broker"] is None
    assert summary["stages"]["stage0"]["compute_seconds"] == pytest.approx(0.01)
    assert summary["stages"]["stage0"]["scraped"] == 1 and summary["stages"]["stage0"]["bytes_out"] == 1024
    assert summary["stages"]["stage1"] == {"compute_seconds": 0.5, "prefill_compute_seconds": 0.25, "prefill_tokens": 100,
                                           "scraped": 0.0}  # not scraped: the driver's view
    assert summary["stages"]["stage0"]["prefill_compute_seconds"] == 0 and summary["stages"]["stage0"]["prefill_tokens"] == 100
    assert [p["up"] for p in summary["processes"]] == [True, True, False]


def test_summary_shows_each_sessions_k_and_acceptance_per_draft_position() -> None:
    stage0 = ('# TYPE skippy_speculative_session_k gauge\nskippy_speculative_session_k{session="7"} 4\n'
              'skippy_speculative_session_k{session="9"} 0\n'
              '# TYPE skippy_speculative_session_alpha gauge\nskippy_speculative_session_alpha{session="7"} 0.8\n'
              'skippy_speculative_session_alpha{session="9"} 0.1\n')
    adapter = ('# TYPE skippy_spec_decode_num_drafts counter\nskippy_spec_decode_num_drafts_total 10\n'
               '# TYPE skippy_spec_decode_num_accepted_tokens_per_pos counter\n'
               'skippy_spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8\n'
               'skippy_spec_decode_num_accepted_tokens_per_pos_total{position="2"} 3\n')
    spec = summarise([("adapter", "a", parse(adapter)), ("stage0", "s0", parse(stage0))])["speculation"]
    assert spec["sessions"] == [{"session": "7", "k": 4, "alpha": 0.8}, {"session": "9", "k": 0, "alpha": 0.1}]
    assert (spec["drafts"], spec["accepted_per_pos"]) == (10, [8, 0, 3])
    assert summarise([])["speculation"] == {"sessions": [], "drafts": 0, "accepted_per_pos": []}


def test_scrape_of_a_process_that_does_not_answer_is_none() -> None:
    assert scrape("http://127.0.0.1:9/metrics", timeout_s=2.0) is None
